package guard

import (
	"testing"
	"unsafe"
)

// A held Lock is one allocation of the heap each held lock costs (issue
// 24 bounds that heap against the peers'): a field added to it must come
// with one taken away, or the allocation moves up a size class.
func TestLockSize(t *testing.T) {
	const limit = 160 // a size class of the Go allocator
	if n := unsafe.Sizeof(Lock{}); n > limit {
		t.Errorf("a Lock is %d bytes, more than %d", n, limit)
	}
}

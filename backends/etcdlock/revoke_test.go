package etcdlock

import (
	"context"
	"testing"
	"unsafe"
)

// TestLeaseSize: a held lock's lease is all the heap it costs the backend
// (BenchmarkHeldLocks), and fits the allocator's 64-byte class.
func TestLeaseSize(t *testing.T) {
	if size := unsafe.Sizeof(lease{}); size > 64 {
		t.Errorf("a lease takes %d bytes, more than 64", size)
	}
}

// TestRevokedFindsItsLease: a marker reaches the one lease whose key it
// names among the session's tracked leases, whatever their place on the
// list, readers' keys included; a key of another directory with the same
// sequence number, a lease forgotten (released) before, and a malformed
// marker reach none; a lease told before its OnRevoke learns of it at once.
func TestRevokedFindsItsLease(t *testing.T) {
	s := &session{l: &Locker{}, id: 0x1a2b, kctx: context.Background(), done: make(chan struct{}), idle: map[string]uint64{}}
	called := map[*lease]int{}
	track := func(name string, reader bool) (*lease, string) {
		dir := KeyDir(name)
		if reader {
			dir += "r/"
		}
		le, own := s.track(name, dir, reader)
		if got := le.key(); got != own {
			t.Fatalf("lease key %q, track said %q", got, own)
		}
		return le, own
	}
	writer, writerKey := track("a/b", false)
	reader, readerKey := track("a/b", true)
	other, otherKey := track("c", false)
	gone, goneKey := track("d", false)
	for _, le := range []*lease{writer, reader, other, gone} {
		le.OnRevoke(func() { called[le]++ })
	}
	s.forget(gone)
	s.revoked(goneKey)
	s.revoked(KeyDir("elsewhere") + readerKey[len(KeyDir("a/b"))+len("r/"):])
	s.revoked("not-a-key")
	if len(called) != 0 {
		t.Fatalf("revocations reported for a forgotten lease or foreign keys: %v", called)
	}

	s.revoked(readerKey)
	if called[reader] != 1 || called[writer] != 0 || called[other] != 0 {
		t.Fatalf("after the reader's marker: writer %d, reader %d, other %d calls; want 0, 1, 0", called[writer], called[reader], called[other])
	}
	s.revoked(otherKey) // the list's head
	s.revoked(writerKey)
	if called[writer] != 1 || called[other] != 1 || s.tracked != nil {
		t.Fatalf("after every marker: writer %d, other %d calls, list head %v; want 1, 1, nil", called[writer], called[other], s.tracked)
	}

	// A marker seen before the lease's OnRevoke.
	early, earlyKey := track("e", false)
	s.revoked(earlyKey)
	told := false
	early.OnRevoke(func() { told = true })
	if !told {
		t.Error("a lease revoked before its OnRevoke was not told at once")
	}
}

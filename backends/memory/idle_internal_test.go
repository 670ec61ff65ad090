package memory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestIdleEntriesBounded: released keys stay in the table for reuse, but
// no more than maxIdle of them, and a key reused from there is held and
// released as any other.
func TestIdleEntriesBounded(t *testing.T) {
	ctx := context.Background()
	l := New()
	o := driver.AcquireOptions{TTL: time.Minute}
	for i := range 10 * maxIdle {
		lease, err := l.Acquire(ctx, fmt.Sprintf("k%d", i), o)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(l.entries); n > maxIdle {
		t.Fatalf("%d entries kept after every key was released, want at most %d", n, maxIdle)
	}
	key := fmt.Sprintf("k%d", 10*maxIdle-1) // released last: still in the table
	first, err := l.Acquire(ctx, key, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, key, o); err != driver.ErrNotAcquired {
		t.Fatalf("second acquisition of a held key: %v, want ErrNotAcquired", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err == nil {
		t.Fatal("a lease released twice was released again")
	}
}

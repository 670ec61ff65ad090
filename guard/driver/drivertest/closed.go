package drivertest

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// releaseAfterCloseBound is how long a Release after its Locker's Close may
// take. Such a release has nothing to wait for: either Close let the lease
// go (a session ended) and the loss is already known, or the backend is
// still reachable and one request does it. Far below the request timeouts
// backends default to (5 s and more), which a release sent over a closed
// connection would run into.
const releaseAfterCloseBound = 2 * time.Second

// testReleaseAfterClose checks, for a backend whose Locker has a Close,
// what a program shutting down does: Close, then release what it held. The
// release returns at once, with nil (Close left the lease, and the release
// gave it up) or ErrNotHeld (Close already let it go), and the lock is free
// afterwards.
func testReleaseAfterClose(t *testing.T, b *Backend) {
	l := b.NewLocker(t)
	closer, ok := l.(io.Closer)
	if !ok {
		t.Skip("the backend's Locker has no Close")
	}
	ctx := b.ctx(t)
	k := key(t)
	lease := mustAcquire(t, l, ctx, k, b.opts(false))
	if err := closer.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	start := time.Now()
	err := lease.Release(ctx)
	took := time.Since(start)
	t.Logf("Release after Close: %v, in %v", err, took)
	if err != nil && !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release after Close: got %v, want nil or ErrNotHeld", err)
	}
	if took > releaseAfterCloseBound {
		t.Errorf("Release after Close took %v, more than %v", took, releaseAfterCloseBound)
	}
	// Nothing of the closed Locker holds the key any more; a backend whose
	// Close ends a session may take a moment to show it.
	other := b.NewLocker(t)
	wctx, cancel := context.WithTimeout(ctx, b.ttl()/2+releaseAfterCloseBound)
	defer cancel()
	next, err := other.Acquire(wctx, k, b.opts(true))
	if err != nil {
		t.Fatalf("Acquire after the closed Locker's release: %v", err)
	}
	if next.Token() <= lease.Token() {
		t.Errorf("token %d after the closed Locker's %d", next.Token(), lease.Token())
	}
	release(t, next)
}

package zklock

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// TestInspectReaders: readers sharing the lock are all its holders, a writer
// queued behind them is a waiter, and ForceRelease of any holder takes every reader, after
// which the writer holds with a greater token.
func TestInspectReaders(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b, admin := dial(t, srv), dial(t, srv), dial(t, srv)
	k := testKey(t)
	var readers []driver.Lease
	for _, l := range []*Locker{a, b} {
		r, err := l.AcquireRead(ctx, k, driver.AcquireOptions{TTL: testSession})
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	inspect := func() driver.Inspection {
		t.Helper()
		in, err := admin.Inspect(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	tokens := func(hs []driver.Holding) []uint64 {
		var out []uint64
		for _, h := range hs {
			out = append(out, h.Token)
		}
		return out
	}
	want := []uint64{readers[0].Token(), readers[1].Token()}
	if in := inspect(); !slices.Equal(tokens(in.Holders), want) || in.Waiters != 0 || !in.Holders[0].SessionBound {
		t.Fatalf("two readers: %+v, want session-bound holders with tokens %v and no waiter", in, want)
	}
	writer := make(chan driver.Lease, 1)
	go func() {
		w, err := a.AcquireWrite(ctx, k, driver.AcquireOptions{TTL: testSession, Wait: true})
		if err != nil {
			t.Error(err)
		}
		writer <- w
	}()
	eventually(t, "the writer queues", func() bool { return inspect().Waiters == 1 })
	got, err := admin.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true})
	if err != nil || !slices.Equal(tokens(got), want) {
		t.Fatalf("ForceRelease: %+v, %v; want the readers with tokens %v", got, err, want)
	}
	w := <-writer
	if w == nil {
		t.FailNow()
	}
	if in := inspect(); !slices.Equal(tokens(in.Holders), []uint64{w.Token()}) || w.Token() <= want[1] {
		t.Fatalf("after the forced release: %+v, writer's token %d; want the writer alone, after %d", in, w.Token(), want[1])
	}
	for _, r := range readers {
		if err := r.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("a forcibly released reader's Release: %v, want ErrNotHeld", err)
		}
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestListOrder: List pages in the keys' own order, whatever their escaped
// node names, and leaves semaphores out.
func TestListOrder(t *testing.T) {
	l := dial(t, servers(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := testKey(t) + "/"
	sem, err := l.AcquireSemaphore(ctx, prefix+"sem", 2, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Release(ctx)
	keys := []string{"a.b", "a", "a-", "a$", "a ", "B", "a/b", "é", "%"}
	for _, k := range keys {
		lease, err := l.Acquire(ctx, prefix+k, driver.AcquireOptions{TTL: testSession})
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
	}
	var got []string
	for after := ""; ; {
		page, err := l.List(ctx, prefix, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			got = append(got, p.Key[len(prefix):])
		}
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Key
	}
	if want := slices.Sorted(slices.Values(keys)); !slices.Equal(got, want) {
		t.Fatalf("listed %q, want %q", got, want)
	}
}

// TestListUnreadable: a lock under another user's ACL, which the session
// may not read, is listed in its place with an Err wrapping zk.ErrNoAuth,
// counted in the limit, and the locks around it are listed as they are.
func TestListUnreadable(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The plain Locker acquires first: the root it creates, if none is
	// there, must not be alice's alone.
	plain, alice := dial(t, srv), dial(t, srv, digestAuth(authPassword), WithACL(zk.AuthACL(zk.PermAll)...))
	prefix := testKey(t) + "/"
	for _, acquire := range []struct {
		l   *Locker
		key string
	}{{plain, "a"}, {alice, "b"}, {plain, "c"}} {
		lease, err := acquire.l.Acquire(ctx, prefix+acquire.key, driver.AcquireOptions{TTL: testSession})
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
	}
	var got []string
	for after := ""; ; {
		page, err := plain.List(ctx, prefix, after, 2)
		if err != nil {
			t.Fatalf("List after %q: %v", after, err)
		}
		for _, p := range page {
			key := p.Key[len(prefix):]
			switch {
			case key == "b" && (!errors.Is(p.Err, zk.ErrNoAuth) || len(p.Holders) != 0):
				t.Errorf("alice's lock: %+v, want no holders and an Err wrapping zk.ErrNoAuth", p)
			case key != "b" && (p.Err != nil || len(p.Holders) != 1):
				t.Errorf("lock %q: %+v, want one holder and no Err", key, p)
			}
			got = append(got, key)
		}
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Key
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("listed %q, want %q", got, want)
	}
}

// TestRevocation: a lease's node deleted by someone else while its session
// lives calls OnRevoke's function, for a semaphore permit (whose watch is
// set after its grant) and for a lock whose node's data was changed first
// (which uses its watch up); a released lease, or one lost with its
// session, is forgotten.
func TestRevocation(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, admin := dial(t, srv), dial(t, srv)
	k := testKey(t)
	opts := driver.AcquireOptions{TTL: testSession}
	revoked := func(held driver.Lease, meddle func(node string)) {
		t.Helper()
		called := make(chan struct{})
		held.(driver.RevocableLease).OnRevoke(func() { close(called) })
		node := held.(*lease).node
		meddle(node)
		select {
		case <-called:
		case <-time.After(10 * time.Second):
			t.Fatalf("OnRevoke's function not called within 10s of the deletion of %s", node)
		}
		if err := held.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release of a revoked lease: %v, want ErrNotHeld", err)
		}
	}
	del := func(node string) {
		if err := admin.conn.Delete(node, -1); err != nil {
			t.Fatal(err)
		}
	}

	permit, err := l.AcquireSemaphore(ctx, k, 2, opts)
	if err != nil {
		t.Fatal(err)
	}
	revoked(permit, del)

	lock, err := l.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	revoked(lock, func(node string) {
		if _, err := admin.conn.Set(node, []byte("meddled"), -1); err != nil {
			t.Fatal(err)
		}
		// Deleted before the watch is set again or after: either the
		// event or the new watch's read finds the node gone.
		del(node)
	})

	released, err := l.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	released.(driver.RevocableLease).OnRevoke(func() { t.Error("OnRevoke's function called for a released lease") })
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lost, err := l.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	lost.(driver.RevocableLease).OnRevoke(func() { t.Error("OnRevoke's function called for a lost lease") })
	l.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.leases) != 0 || lost.(*lease).revoke != nil {
		t.Fatalf("leases still tracked after their release and loss: %v", l.leases)
	}
}

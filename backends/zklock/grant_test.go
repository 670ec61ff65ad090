package zklock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// TestGrantWithoutRead: a lock's grant costs no request of its own. Alone in
// the queue, the contender holds after its create, and its watch follows;
// queued behind one holder, after its create, a listing, the watch on the
// holder's node and, once that node is gone, the read of its own node that
// sets its watch: go-zookeeper's Lock sends a listing in its place. Either
// way its token is its node's czxid, on the Locker's session, and tokens
// grow from holder to holder.
func TestGrantWithoutRead(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, other := dial(t, srv), dial(t, srv)
	k := testKey(t)
	opts := driver.AcquireOptions{TTL: testSession}
	check := func(held driver.Lease, by *Locker) {
		t.Helper()
		_, stat, err := by.conn.Get(held.(*lease).node)
		if err != nil {
			t.Fatal(err)
		}
		if held.Token() != uint64(stat.Czxid) || stat.EphemeralOwner != by.conn.SessionID() || held.(*lease).ep.session != stat.EphemeralOwner {
			t.Fatalf("token %d, session %d; want the node's czxid %d and owner %d", held.Token(), held.(*lease).ep.session, stat.Czxid, stat.EphemeralOwner)
		}
	}
	// The first acquisition may create the parent and the root.
	first, err := l.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	before := l.requests.Load()
	alone, err := l.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lease's watch is set", func() bool { return l.watching.Load() == 0 })
	if n := l.requests.Load() - before; n != 2 {
		t.Errorf("uncontended Acquire sent %d requests, want 2 (the create, then the watch after the grant)", n)
	}
	check(alone, l)
	if alone.Token() <= first.Token() {
		t.Errorf("token %d after %d", alone.Token(), first.Token())
	}

	before = other.requests.Load()
	got := acquireLater(ctx, t, other, k)
	eventually(t, "the second contender watches the holder", func() bool { return other.requests.Load()-before == 3 })
	if err := alone.Release(ctx); err != nil {
		t.Fatal(err)
	}
	queued := <-got
	if queued == nil {
		t.FailNow()
	}
	time.Sleep(10 * watchDelay)
	if n := other.requests.Load() - before; n != 4 || other.watching.Load() != 0 {
		t.Errorf("queued Acquire sent %d requests, want 4 (create, list, watch, read of its node), and %d watches are pending", n, other.watching.Load())
	}
	check(queued, other)
	if queued.Token() <= alone.Token() {
		t.Errorf("token %d after %d", queued.Token(), alone.Token())
	}
	if err := queued.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRevocationOfQueuedGrant: a lock granted by a listing hears of its
// node's deletion, whether the deletion comes before its data watch is set
// (the watch's read finds the node gone) or after (the watch fires).
func TestRevocationOfQueuedGrant(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, holder, admin := dial(t, srv), dial(t, srv), dial(t, srv)
	for _, watchFirst := range []bool{false, true} {
		k := testKey(t)
		blocker, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
		if err != nil {
			t.Fatal(err)
		}
		got := acquireLater(ctx, t, l, k)
		eventually(t, "the contender queues", func() bool { return waiters(t, admin, k) == 1 })
		if err := blocker.Release(ctx); err != nil {
			t.Fatal(err)
		}
		held := <-got
		if held == nil {
			t.FailNow()
		}
		called := make(chan struct{})
		held.(driver.RevocableLease).OnRevoke(func() { close(called) })
		if watchFirst {
			eventually(t, "the holder watches its node", func() bool { return l.watching.Load() == 0 })
		}
		if err := admin.conn.Delete(held.(*lease).node, -1); err != nil {
			t.Fatal(err)
		}
		select {
		case <-called:
		case <-time.After(10 * time.Second):
			t.Fatalf("watchFirst %v: OnRevoke's function not called within 10s of the deletion", watchFirst)
		}
		if err := held.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release of a revoked lease: %v, want ErrNotHeld", err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.leases) != 0 {
		t.Fatalf("leases still tracked after their revocation: %v", l.leases)
	}
}

// TestGrantWithoutWritePermission: with an ACL that lets the Locker create
// and delete nodes but not write their data, the create's write of the
// parent's data is refused; the Locker then creates contender nodes alone
// and reads the token at the grant.
func TestGrantWithoutWritePermission(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := dial(t, srv, WithACL(zk.WorldACL(zk.PermRead|zk.PermCreate|zk.PermDelete)...))
	k := testKey(t)
	var last uint64
	for i := range 3 {
		held, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		_, stat, err := l.conn.Get(held.(*lease).node)
		if err != nil {
			t.Fatal(err)
		}
		if held.Token() != uint64(stat.Czxid) || held.Token() <= last {
			t.Fatalf("acquisition %d: token %d, want the node's czxid %d, above %d", i, held.Token(), stat.Czxid, last)
		}
		last = held.Token()
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !l.plainCreate.Load() {
		t.Error("the Locker still creates with a write of the parent it may not write")
	}
}

// TestWaiterDeletedWhileQueued: a waiter whose node an operator deleted
// while it queued behind the only holder is not granted the lock on that
// node when the holder leaves: it finds its node gone and queues again.
func TestWaiterDeletedWhileQueued(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, holder, admin := dial(t, srv), dial(t, srv), dial(t, srv)
	k := testKey(t)
	blocker, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	before := l.requests.Load()
	got := acquireLater(ctx, t, l, k)
	eventually(t, "the waiter watches the holder", func() bool { return l.requests.Load()-before == 3 })
	var deleted string
	for _, c := range children(t, admin, k) {
		if node := admin.lockPath(k) + "/" + c; node != blocker.(*lease).node {
			deleted = node
		}
	}
	if err := admin.conn.Delete(deleted, -1); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held := <-got
	if held == nil {
		t.FailNow()
	}
	defer held.Release(ctx)
	node := held.(*lease).node
	ok, stat, err := admin.conn.Exists(node)
	if err != nil {
		t.Fatal(err)
	}
	if node == deleted || !ok || held.Token() != uint64(stat.Czxid) {
		t.Fatalf("granted on %s (exists %v, token %d), after %s was deleted", node, ok, held.Token(), deleted)
	}
}

// TestDelayedWatchesShareATimer grants leases on one Locker one after the
// other, the second released at once: each lease still held gets its
// watch, once, from the Locker's one timer (which fires for the first, and
// is armed again for the last unless a slow machine made both due by then),
// and hears the deletion of its node; the released one is passed over, and
// once no lease waits the timer has nothing left to do.
func TestDelayedWatchesShareATimer(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, admin := dial(t, srv), dial(t, srv)
	opts := driver.AcquireOptions{TTL: testSession}
	keys := []string{testKey(t), testKey(t), testKey(t)}
	for _, k := range keys {
		// The first acquisition of a key creates its parent.
		lease, err := l.Acquire(ctx, k, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "no watch is pending", func() bool { return l.watching.Load() == 0 })

	before := l.requests.Load()
	var held []driver.Lease
	for i, k := range keys {
		lease, err := l.Acquire(ctx, k, opts)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			held = append(held, lease)
		}
	}
	eventually(t, "the held leases' watches are set", func() bool { return l.watching.Load() == 0 })
	// 3 creates, 1 delete and a watch for each held lease; the released one
	// may have had its watch too, on a machine slow enough to release it
	// after watchDelay.
	if n := l.requests.Load() - before; n != 6 && n != 7 {
		t.Errorf("%d requests, want 6 or 7: 3 creates, a delete, a watch for each of the 2 leases held (and one for the released lease at most)", n)
	}
	for _, h := range held {
		called := make(chan struct{})
		h.(driver.RevocableLease).OnRevoke(func() { close(called) })
		if err := admin.conn.Delete(h.(*lease).node, -1); err != nil {
			t.Fatal(err)
		}
		select {
		case <-called:
		case <-time.After(10 * time.Second):
			t.Fatal("the deletion of a held lease's node was not heard within 10s")
		}
		if err := h.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release of a revoked lease: %v, want ErrNotHeld", err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unwatchedLive != 0 || len(l.unwatched) != 0 {
		t.Errorf("after every lease is gone, %d leases wait for a watch, %d are listed", l.unwatchedLive, len(l.unwatched))
	}
}

// TestWatchTimer drives the Locker's one timer for delayed watches with
// leases that are not tracked (so that setting their watch sends nothing):
// each lease's watch is set off watchDelay after its grant, in grant order,
// the timer being armed again for the next lease still waiting; a lease
// forgotten first is passed over; and with none left waiting, the timer is
// stopped.
func TestWatchTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &Locker{leases: map[string]*lease{}, quit: make(chan struct{})}
		a, b, c := &lease{l: l, node: "a"}, &lease{l: l, node: "b"}, &lease{l: l, node: "c"}
		waiting := func() []string {
			l.mu.Lock()
			defer l.mu.Unlock()
			var names []string
			for _, le := range []*lease{a, b, c} {
				if !le.watchAt.IsZero() {
					names = append(names, le.node)
				}
			}
			return names
		}
		l.watchAfter(a)
		time.Sleep(time.Millisecond)
		l.watchAfter(b)
		time.Sleep(time.Millisecond)
		l.watchAfter(c)
		l.untrack(b)
		time.Sleep(watchDelay - 2*time.Millisecond)
		synctest.Wait()
		if w := waiting(); !slices.Equal(w, []string{"c"}) {
			t.Errorf("at a's due time, %v wait for their watch, want [c]", w)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if w := waiting(); len(w) != 0 {
			t.Errorf("at c's due time, %v still wait for their watch", w)
		}
		if n := l.watching.Load(); n != 0 {
			t.Errorf("%d watches counted as being set, want 0", n)
		}

		l.watchAfter(a)
		l.untrack(a)
		l.mu.Lock()
		live, listed, armed := l.unwatchedLive, len(l.unwatched), l.watchTimer.Stop()
		l.mu.Unlock()
		if live != 0 || listed != 0 || armed {
			t.Errorf("with the only waiting lease forgotten: %d waiting, %d listed, timer armed %v; want 0, 0, false", live, listed, armed)
		}
		l.bg.Wait()
	})
}

// TestWatchOfGoneNodeLeavesNone: the node a waiter queues behind may go
// between the listing and the watch. The watch's read then finds it gone
// and the server keeps no watch for it, where an exists watch would stay
// registered for a creation that never comes, until the session ends. A
// watch on a node that is there is kept, and seen by the same check.
func TestWatchOfGoneNodeLeavesNone(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := dial(t, srv)
	held, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	there := held.(*lease).node
	gone := there + "-gone"
	if _, err := l.watchNode(ctx, gone); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("watch of a missing node: %v, want zk.ErrNoNode", err)
	}
	if _, err := l.watchNode(ctx, there); err != nil {
		t.Fatal(err)
	}
	watches := fourLetter(t, srv[0], "wchp")
	if !strings.Contains(watches, there+"\n") {
		t.Fatalf("no watch on %s among the server's watches:\n%s", there, watches)
	}
	if strings.Contains(watches, gone+"\n") {
		t.Fatalf("the server keeps a watch on the missing %s", gone)
	}
}

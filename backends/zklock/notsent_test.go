package zklock

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// heldAndClaimed holds a new key and claims its record (see
// drivertest.HeldAndClaimed).
func heldAndClaimed(t *testing.T) (string, func() (held, kept bool)) {
	key := testKey(t)
	return key, drivertest.HeldAndClaimed(t, dial(t, servers(t)), newTestStore(t, servers(t)), key)
}

// TestChangesUnsentMarkedNotSent: a forced release, a record's delete and
// its abandon asked once the server is gone (its port closed, the
// connections reset) fail matching driver.ErrNotSent, and the lock and
// the record are kept.
func TestChangesUnsentMarkedNotSent(t *testing.T) {
	ctx := testCtx(t)
	key, still := heldAndClaimed(t)
	p := drivertest.StartProxy(t, servers(t)[0])
	l, st := dial(t, []string{p.Addr()}), newTestStore(t, []string{p.Addr()})
	if _, err := l.Inspect(ctx, key); err != nil { // connected
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "s", key); err != nil {
		t.Fatal(err)
	}
	p.Down()
	drivertest.WantNotSent(t, ctx, drivertest.OperatorChanges(l, st, key))
	if held, kept := still(); !held || !kept {
		t.Errorf("after the unsent changes: held %v, kept %v; want both", held, kept)
	}
}

// TestDeletesRefusedMarkedNotSent: a forced release, a record's delete and
// its abandon whose reads are answered but whose delete the ensemble
// refuses (the nodes' parents' ACL grants all but DELETE: ZNOAUTH, which
// fails the multi whole) fail matching driver.ErrNotSent, and the lock and
// the record are kept.
func TestDeletesRefusedMarkedNotSent(t *testing.T) {
	ctx := testCtx(t)
	key, still := heldAndClaimed(t)
	l, st := dial(t, servers(t)), newTestStore(t, servers(t))
	_, record := st.place("s", key)
	admin := connect(t, servers(t))
	for _, parent := range []string{l.lockPath(key), record} {
		if _, err := admin.SetACL(parent, zk.WorldACL(zk.PermAll&^zk.PermDelete), -1); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.SetACL(parent, zk.WorldACL(zk.PermAll), -1) })
	}
	drivertest.WantNotSent(t, ctx, drivertest.OperatorChanges(l, st, key))
	if held, kept := still(); !held || !kept {
		t.Errorf("after the refused deletes: held %v, kept %v; want both", held, kept)
	}
}

// TestChangesUnansweredNotMarked: a change whose answer is lost after the
// ensemble ran it (its answer held back by the proxy, the connection then
// reset) fails without driver.ErrNotSent.
func TestChangesUnansweredNotMarked(t *testing.T) {
	ctx := testCtx(t)
	p := drivertest.StartProxy(t, servers(t)[0])
	// Sessions long enough to outlast the answers held back.
	l := dial(t, []string{p.Addr()}, WithSessionTimeout(20*time.Second))
	st := newTestStore(t, []string{p.Addr()})
	for _, change := range []string{"ForceRelease", "Delete", "DeleteOwned", "Abandon"} {
		t.Run(change, func(t *testing.T) {
			p.Reset()
			key, still := heldAndClaimed(t)
			if _, err := l.Inspect(ctx, key); err != nil { // connected again
				t.Fatal(err)
			}
			if _, err := st.Get(ctx, "s", key); err != nil {
				t.Fatal(err)
			}
			f := drivertest.OperatorChanges(l, st, key)[change]
			drivertest.WantAnswerLostUnmarked(t, p, time.Second, func() error { return f(ctx) }, func() bool {
				held, kept := still()
				return change == "ForceRelease" && !held || change != "ForceRelease" && !kept
			})
		})
	}
}

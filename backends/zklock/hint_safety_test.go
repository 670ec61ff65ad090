package zklock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestHintedNodeGoneWithOthersAhead: the hints name the node a waiter
// queues behind, and the deletion of that node means the waiter holds only
// when it was the only node ahead. Here the hinted node is a waiter that
// gives up while the holder still holds: the waiter must list the queue
// and wait for the holder, not take the deletion for its turn.
func TestHintedNodeGoneWithOthersAhead(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, l, quitter, admin := dial(t, srv), dial(t, srv), dial(t, srv), dial(t, srv)
	k := testKey(t)
	parent := l.lockPath(k)
	blocker, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	giveUp := queueQuitter(ctx, t, quitter, admin, k)
	// l's hint: the queue's newest node is the quitter's.
	names := noteQueue(t, l, parent)
	quitterNode := ""
	for _, c := range queue(nil, names) {
		if c.name != blocker.(*lease).node[len(parent)+1:] {
			quitterNode = parent + "/" + c.name
		}
	}
	got := acquireLater(ctx, t, l, k)
	eventually(t, "l watches the quitter's node, as the hint says", func() bool {
		return watches(t, srv[0], l.conn.SessionID(), quitterNode)
	})
	giveUp()
	var early driver.Lease
	eventually(t, "l, woken, lists the queue and watches the holder's node", func() bool {
		select {
		case early = <-got:
			return true
		default:
		}
		return watches(t, srv[0], l.conn.SessionID(), blocker.(*lease).node)
	})
	if early != nil {
		t.Fatalf("l holds (token %d) while the holder still does", early.Token())
	}
	if err := blocker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held := <-got
	if held == nil {
		t.FailNow()
	}
	if held.Token() <= blocker.Token() {
		t.Errorf("token %d after the holder's %d", held.Token(), blocker.Token())
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

package redlock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestRollingRestartForgetsTheLock is what doc.go says of nodes without
// persistence restarted one after another, as a rolling restart does,
// with no delay: once a majority has restarted empty, within one TTL,
// another process takes a lock its holder still holds. What holds: the
// second holder's token is above the first's, and the first holder's
// renewal fails.
func TestRollingRestartForgetsTheLock(t *testing.T) {
	servers := startServers(t, 3)
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: time.Minute}
	first := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	second := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	held, err := first.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatal(err)
	}
	servers[0].Restart(t)
	if _, err := second.Acquire(ctx, "k", opts); err == nil {
		t.Fatal("taken again with one node of 3 restarted")
	}
	servers[1].Restart(t)
	again, err := second.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatalf("with 2 nodes of 3 restarted empty: %v, want the lock taken again (the hazard doc.go describes)", err)
	}
	if again.Token() <= held.Token() {
		t.Errorf("token %d of the second holder, not above the first's %d", again.Token(), held.Token())
	}
	if err := held.Refresh(ctx, time.Minute); err == nil {
		t.Error("the first holder's renewal succeeded after the second took the lock")
	}
}

// TestTokensAfterAQuickRestart is what doc.go says of tokens when a
// majority of the nodes forget their fences: they stay above every earlier
// token unless the nodes were away for less than the lead of those tokens
// over the nodes' clocks, which proposals can take up to the node timeout
// (contenders taking turns pushed it to 74ms within 40s, each proposal
// above the fence another's left). Here a Locker's proposals lead the
// clocks by half its node timeout; the nodes restart empty, in less time
// than that, and a new Locker's token is below its last.
func TestTokensAfterAQuickRestart(t *testing.T) {
	servers := startServers(t, 3)
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 5 * time.Second}
	const nodeTimeout = 2 * time.Second
	ahead := privateLocker(t, servers, nil, WithNodeTimeout(nodeTimeout))
	// The time away is counted from before the first acquisition, which
	// the Locker learns the nodes' clocks from: a slow answer there puts
	// the proposal further ahead (past the node timeout, the nodes refuse
	// to record it), to after the next grant: the nodes, restarted empty,
	// give the next token their clock, moved on since by no more than that.
	began := time.Now()
	lease, err := ahead.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatal(err)
	}
	lease.Release(ctx)
	// Proposals half the node timeout ahead of the fences, which follow
	// the clocks: the nodes record them.
	ahead.fenceBase.Add((nodeTimeout / 2).Microseconds())
	lease, err = ahead.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatal(err)
	}
	lease.Release(ctx)
	last := lease.Token()
	for _, s := range servers {
		s.Restart(t)
	}
	next, err := privateLocker(t, servers, nil, WithNodeTimeout(nodeTimeout)).Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatal(err)
	}
	next.Release(ctx)
	if away := time.Since(began); away >= nodeTimeout/2 {
		t.Skipf("the restarts and the next grant took %v, not less than the lead", away)
	}
	if next.Token() >= last {
		t.Errorf("token %d after a quick restart, not below %d: the hazard doc.go describes is gone", next.Token(), last)
	}
}

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

package redlock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestLockersOnDifferentNodeSets is what doc.go says of Lockers given
// different nodes, as while a deployment of three masters grows to five:
// a majority of three and a majority of five can share no node. The
// Locker on three holds the lock on two of them (the third out of its
// reach); the Locker on five takes it on the other three while the first
// still holds it. Nothing on the nodes can tell: each saw one vote.
func TestLockersOnDifferentNodeSets(t *testing.T) {
	servers := startServers(t, 5)
	// The third node of the first Locker's is out of its reach.
	three, err := New(clients(t, []string{servers[0].Addr(), servers[1].Addr(), drivertest.ClosedAddr(t)}, nil), WithNodeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	five := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: time.Minute}
	held, err := three.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatalf("two of three nodes: %v", err)
	}
	again, err := five.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatalf("the other three of five: %v, want the lock taken again (the hazard doc.go describes)", err)
	}
	if left := time.Until(held.Expiry()); left <= 0 {
		t.Fatalf("the first lease had expired (%v) when the second was granted", left)
	}
	again.Release(ctx)
	held.Release(ctx)
}

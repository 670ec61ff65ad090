package redlock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestFailedShorterRefreshBoundsExpiry: a refresh to a TTL shorter than
// what the lease has left shortens the votes on the nodes it reaches, even
// when it fails (here every answer is lost). The lease's Expiry must not
// stay where the longer votes put it: another Locker takes the lock once
// the shortened votes lapse, and the holder, told by Expiry that it still
// held the lock, went on working beside it.
func TestFailedShorterRefreshBoundsExpiry(t *testing.T) {
	servers := startServers(t, 3)
	proxies := make([]*drivertest.Proxy, len(servers))
	addrs := make([]string, len(servers))
	for i, s := range servers {
		proxies[i] = drivertest.StartProxy(t, s.Addr())
		addrs[i] = proxies[i].Addr()
	}
	const nodeTimeout = 200 * time.Millisecond
	holder, err := New(clients(t, addrs, nil), WithNodeTimeout(nodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	other := privateLocker(t, servers, nil, WithNodeTimeout(nodeTimeout))
	ctx := context.Background()
	lease, err := holder.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// A first refresh loads its script on the nodes: an EVALSHA whose
	// NOSCRIPT is lost would run nothing.
	if err := lease.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		p.LoseReplies()
	}
	short := MinTTLFactor * nodeTimeout
	if err := lease.Refresh(ctx, short); err == nil {
		t.Fatal("a refresh whose answers were all lost succeeded")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		taken, err := other.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Minute})
		if err == nil {
			at := time.Now()
			if e := lease.Expiry(); e.After(at) {
				t.Errorf("another Locker took the lock while the holder's Expiry was %v ahead", e.Sub(at).Round(time.Millisecond))
			}
			taken.Release(ctx)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shortened votes did not lapse: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

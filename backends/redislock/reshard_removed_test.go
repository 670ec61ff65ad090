package redislock

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

// TestReshardRemovedMasterInView: clients that still count a master
// emptied and removed from the cluster among their seed addresses, as a
// deployment's configuration keeps them, may load their slot map from it,
// which serves no slot any more, and send it commands, which it answers
// "CLUSTERDOWN Hash slot not served" having run nothing: acquisitions and
// releases go on working, on the members.
func TestReshardRemovedMasterInView(t *testing.T) {
	c := startReshardCluster(t, 2)
	d := c.add()
	key := "reshard/removed"
	slot := c.slot(lockKeyOf(key))
	c.moveSlot(slot, c.owner(slot), d, 10, nil)
	c.moveSlot(slot, d, c.shards[0], 10, nil)
	c.remove(d)
	ctx := context.Background()
	for i := range 60 {
		cc := c.client(func(o *goredis.ClusterOptions) { o.Addrs = append(o.Addrs, d.addr) })
		l := newLocker(t, cc)
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lease, err := l.Acquire(actx, fmt.Sprintf("%s/%d", key, i), driver.AcquireOptions{TTL: 10 * time.Second})
		if err == nil {
			err = lease.Release(actx)
		}
		cancel()
		if err != nil {
			t.Fatalf("client %d, with the removed master among its seeds: %v", i, err)
		}
	}
}

// TestReshardFenceAfterRemoval: a Fence whose client's slot map still
// names a master that the resource's slot left before it was removed
// sends its write there, and is answered "CLUSTERDOWN Hash slot not
// served": the map is reloaded, and the write done on the slot's master
// within a fraction of the client's minute between its own reloads.
func TestReshardFenceAfterRemoval(t *testing.T) {
	c := startReshardCluster(t, 2)
	d := c.add()
	ctx := context.Background()
	const res = "{reshard/fence-removed}"
	slot := c.slot(res)
	c.moveSlot(slot, c.owner(slot), d, 10, nil)
	f, err := NewFence(c.client())
	if err != nil {
		t.Fatal(err)
	}
	// The client's map names d for the slot, and is not reloaded while the
	// slot leaves d and d is removed.
	if err := f.Set(ctx, fence.Claim{Resource: res, Token: 1}, res+":a", "1", 0); err != nil {
		t.Fatal(err)
	}
	c.moveSlot(slot, d, c.shards[0], 10, nil)
	c.remove(d)
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := f.Set(fctx, fence.Claim{Resource: res, Token: 2}, res+":a", "2", 0); err != nil {
		t.Fatalf("a fenced write after the removal: %v", err)
	}
}

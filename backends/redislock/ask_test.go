package redislock

import (
	"context"
	"net"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// openSlot makes f, a Fence on a ReadOnly client of c, and resource's
// token 5, on its master src; f reads it once, so that its slot map is
// loaded. Then it opens the migration of the slot to dst, another member,
// and moves the key: while the slot stays open, src answers each read of
// the key ASK.
func openSlot(t *testing.T, c *reshardCluster, resource string) (f *Fence, src, dst *shard) {
	t.Helper()
	f, err := NewFence(c.client(func(o *goredis.ClusterOptions) { o.ReadOnly = true }))
	if err != nil {
		t.Fatal(err)
	}
	key := f.Key(resource)
	slot := c.slot(key)
	src = c.owner(slot)
	dst = c.other(src)
	c.must(src, "HSET", key, "t", 5)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if h, err := f.Highest(ctx, resource); err != nil || h != 5 {
		t.Fatalf("Highest before the move = %d, %v", h, err)
	}
	c.must(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
	c.must(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
	host, port, _ := net.SplitHostPort(dst.addr)
	c.must(src, "MIGRATE", host, port, "", 0, 5000, "KEYS", key)
	return f, src, dst
}

// clusterSlotsCalls is the number of CLUSTER SLOTS the members have
// answered.
func clusterSlotsCalls(t *testing.T, c *reshardCluster) int64 {
	t.Helper()
	var n int64
	for _, s := range c.shards {
		n += commandStat(t, s, "cluster|slots", "calls")
	}
	return n
}

// TestAskedNodeKept: while a slot migrates, a ReadOnly client's reads of a
// key already moved, each answered ASK by the slot's master, find the node
// named once, not by a load of the slot map each.
func TestAskedNodeKept(t *testing.T) {
	c := startReshardCluster(t, 2)
	const resource = "{ask}kept"
	f, src, _ := openSlot(t, c, resource)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before, asks := clusterSlotsCalls(t, c), commandStat(t, src, "hget", "rejected_calls")
	const n = 50
	for range n {
		if h, err := f.Highest(ctx, resource); err != nil || h != 5 {
			t.Fatalf("Highest while the slot is open = %d, %v; want 5", h, err)
		}
	}
	if got := commandStat(t, src, "hget", "rejected_calls") - asks; got < n {
		t.Fatalf("%d reads, %d answered ASK by %s: the key is not being asked for", n, got, src.addr)
	}
	// The first read loads the map; a periodic reload of go-redis's may
	// come too.
	got := clusterSlotsCalls(t, c) - before
	t.Logf("%d reads answered ASK: %d CLUSTER SLOTS", n, got)
	if got > 2 {
		t.Errorf("%d reads answered ASK cost %d CLUSTER SLOTS; want at most 2", n, got)
	}
}

// TestAskedNodeClosed: the client of the node that an ASK answer named,
// kept for the reads after, closed since (as go-redis closes its client of
// a node that left the slot map, and makes another should it come back),
// fails no read: the node is found anew, and kept.
func TestAskedNodeClosed(t *testing.T) {
	c := startReshardCluster(t, 2)
	const resource = "{ask}closed"
	f, _, dst := openSlot(t, c, resource)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if h, err := f.Highest(ctx, resource); err != nil || h != 5 {
		t.Fatalf("Highest while the slot is open = %d, %v; want 5", h, err)
	}
	kept := f.slots.asked.Load()
	if kept == nil || kept.addr != dst.addr {
		t.Fatalf("kept %+v; want the node at %s", kept, dst.addr)
	}
	closed := goredis.NewClient(&goredis.Options{Addr: dst.addr})
	closed.Close()
	f.slots.asked.Store(&askedNode{addr: dst.addr, node: closed})
	for i := range 3 {
		if h, err := f.Highest(ctx, resource); err != nil || h != 5 {
			t.Fatalf("Highest %d after the kept client closed = %d, %v; want 5", i, h, err)
		}
	}
	if now := f.slots.asked.Load(); now == nil || now.node != kept.node {
		t.Errorf("kept %+v after the reads; want go-redis's client of %s again", now, dst.addr)
	}
}

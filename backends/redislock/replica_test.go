package redislock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// TestReadsOnMasterWithReadOnlyClient: a Cluster client with ReadOnly set
// sends the commands Redis flags read-only to a replica, which may lag its
// master. Inspect, List and the Store's Get (as a user allowed only to
// read the keys), and the Fence's Highest, through such a client, read on
// the master: the replica, whose link to its master is cut just before each
// lock is taken, gets none of their commands, and each held lock reads as
// held.
func TestReadsOnMasterWithReadOnlyClient(t *testing.T) {
	c := startReshardCluster(t, 1)
	m := c.shards[0]
	r := c.replicate(m)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder := newLocker(t, c.client())
	reader := c.client(func(o *goredis.ClusterOptions) { o.ReadOnly = true })
	// Inspect, List and Get as a user allowed only to read the keys, which
	// may run EVALSHA_RO on them but not EVALSHA.
	for _, s := range []*shard{m, r} {
		c.must(s, "ACL", "SETUSER", "ops", "reset", "on", ">pw", "&*", "+@all", "%R~*")
	}
	ops := c.client(func(o *goredis.ClusterOptions) { o.ReadOnly, o.Username, o.Password = true, "ops", "pw" })
	ro := newLocker(t, ops)
	fence, err := NewFence(reader)
	if err != nil {
		t.Fatal(err)
	}
	store, err := NewStore(ops)
	if err != nil {
		t.Fatal(err)
	}
	reads := func() int64 {
		n := serverCalls(t, r.admin)
		return n["evalsha_ro"] + n["eval_ro"] + n["evalsha"] + n["eval"] + n["get"] + n["hget"]
	}
	for i := range 3 {
		key := fmt.Sprintf("ro/%d", i)
		// Writes made now reach the replica only once it has reconnected.
		c.must(r, "CLIENT", "KILL", "TYPE", "master")
		if _, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		c.must(m, "HSET", fence.Key(key), "t", i+1)
		before := reads()
		in, err := ro.Inspect(ctx, key)
		if err != nil || len(in.Holders) != 1 {
			t.Errorf("Inspect(%s) = %+v, %v; want one holder", key, in, err)
		}
		page, err := ro.List(ctx, "ro/", "", 10)
		if err != nil || len(page) != i+1 || page[i].Key != key || len(page[i].Holders) != 1 {
			t.Errorf("List = %+v, %v; want %d held locks, %s last", page, err, i+1, key)
		}
		if tok, err := fence.Highest(ctx, key); err != nil || tok != uint64(i+1) {
			t.Errorf("Highest(%s) = %d, %v; want %d", key, tok, err, i+1)
		}
		if _, err := store.Get(ctx, "s", key); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("Store.Get = %v; want no record", err)
		}
		if n := reads() - before; n != 0 {
			t.Errorf("the replica answered %d reads", n)
		}
	}
}

// TestInspectReadOnlyClientAfterReshard: a ReadOnly Cluster client whose
// slot map still names the master a lock's slot has left inspects the lock
// as held: that master's MOVED answer has the map reloaded (go-redis would
// reload it a minute later), and the script is sent again to the new one.
func TestInspectReadOnlyClientAfterReshard(t *testing.T) {
	c := startReshardCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "ro/moved"
	if _, err := newLocker(t, c.client()).Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	ro := newLocker(t, c.client(func(o *goredis.ClusterOptions) { o.ReadOnly = true }))
	if in, err := ro.Inspect(ctx, key); err != nil || len(in.Holders) != 1 {
		t.Fatalf("Inspect before the move = %+v, %v; want one holder", in, err)
	}
	slot := c.slot(lockKeyOf(key))
	src := c.owner(slot)
	c.moveSlot(slot, src, c.other(src), 100, nil)
	if in, err := ro.Inspect(ctx, key); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect after the move = %+v, %v; want one holder", in, err)
	}
}

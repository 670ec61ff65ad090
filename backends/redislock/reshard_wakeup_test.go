package redislock

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// TestReshardWakeupAfterNodeRemoved: a waiter's Pub/Sub connection goes
// to the master of its Locker's channel's slot. When that slot moves to
// another master, the release's PUBLISH still reaches the waiter, since the
// cluster relays it to every member. When the master is then emptied and
// removed, as redis-cli --cluster del-node does (forgotten by the others,
// reset, still running), it answers the waiter's connection as before but
// hears no member's PUBLISH: the waiter must not sleep through the
// release, here until a quarter of the TTL.
func TestReshardWakeupAfterNodeRemoved(t *testing.T) {
	r := newRemovalRig(t)
	ctx := context.Background()
	key := r.keyOff(0)
	held := r.take(key)
	got := r.wait(r.wctx, r.waiting, key)

	// Every slot leaves d, which stays a member.
	r.empty()
	at := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mine := woken(t, "the channel's slot moved away from the waiter's node", got, at, removalTTL)
	if err := mine.Release(ctx); err != nil {
		t.Fatal(err)
	}

	held = r.take(key)
	got = r.wait(r.wctx, r.waiting, key)
	r.c.remove(r.d)
	at = time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mine = woken(t, "the waiter's node removed", got, at, removalTTL)
	if err := mine.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReshardWakeupAfterNodeRemovedProbeNodePaused: as in
// TestReshardWakeupAfterNodeRemoved, the waiter's node is emptied and
// removed, and while the master that publishes its connection's probes is
// paused (CLIENT PAUSE, 8 s), which says nothing of the connection, the
// probe is published from another member: the waiter does not sleep
// through the release until the pause ends.
func TestReshardWakeupAfterNodeRemovedProbeNodePaused(t *testing.T) {
	r := newRemovalRig(t)
	ctx := context.Background()
	r.empty()
	// The waiter's client loads the slots where they are now: its probe
	// goes to the master of its channel's slot, which is paused below.
	cc := r.waiting.client.(*goredis.ClusterClient)
	paused := r.c.owner(r.c.slot(r.waiting.wake))
	eventually(t, "the waiter's client sees its channel's slot on "+paused.addr, func() bool {
		cc.ReloadState(ctx)
		m, err := cc.MasterForKey(ctx, r.waiting.wake)
		return err == nil && m.Options().Addr == paused.addr
	})
	var key string
	for i := 0; key == ""; i++ {
		if k := r.keyOff(i); r.c.owner(r.c.slot(lockKeyOf(k))) != paused {
			key = k
		}
	}
	held := r.take(key)
	got := r.wait(r.wctx, r.waiting, key)
	r.c.remove(r.d)
	r.c.must(paused, "CLIENT", "PAUSE", 8000, "ALL")
	at := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mine := woken(t, "the waiter's node removed, its probe's master paused", got, at, removalTTL)
	if err := mine.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// removalTTL is the TTL of the locks of a removalRig.
const removalTTL = time.Minute

// removalRig is a Locker (waiting) whose Pub/Sub connection is on a master
// d added to a cluster of three, with the slot of its channel, and kept by
// a waiter for another key for the whole test; holder takes the keys it
// waits for.
type removalRig struct {
	t               *testing.T
	c               *reshardCluster
	d               *shard
	holder, waiting *Locker
	onD             []int // the slots moved to d
	wctx            context.Context
}

func newRemovalRig(t *testing.T) *removalRig {
	c := startReshardCluster(t, 3)
	r := &removalRig{t: t, c: c, d: c.add(), holder: newLocker(t, c.client())}
	ctx := context.Background()
	wctx, stop := context.WithCancel(ctx)
	r.wctx = wctx
	t.Cleanup(stop)

	// The waiting Locker's Pub/Sub connection goes to the master of its
	// channel's slot, put on d; or, when go-redis dials it before the
	// first SUBSCRIBE is written, to any node the client knows: another
	// Locker is made then. A waiter for another key keeps the connection
	// for the whole test.
	for attempt := 1; r.waiting == nil; attempt++ {
		if attempt > 5 {
			t.Fatalf("the waiter's connection was made to another node than %s 5 times", r.d.addr)
		}
		// A long waiter timeout: the waiter comes back to renew its
		// record only after the quarter of the TTL that bounds a lost
		// wake-up.
		l, err := New(c.client(), WithWaiterTimeout(90*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		slot := c.slot(l.wake)
		if src := c.owner(slot); src != r.d {
			c.moveSlot(slot, src, r.d, 10, nil)
			r.onD = append(r.onD, slot)
		}
		// The client may have loaded the slots before they moved.
		cc := l.client.(*goredis.ClusterClient)
		eventually(t, "the waiter's client sees its channel's slot on "+r.d.addr, func() bool {
			cc.ReloadState(ctx)
			m, err := cc.MasterForKey(ctx, l.wake)
			return err == nil && m.Options().Addr == r.d.addr
		})
		other := r.keyOff(1000 + attempt)
		held := r.take(other)
		octx, ostop := context.WithCancel(wctx)
		got := r.wait(octx, l, other)
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if n, err := r.d.admin.PubSubNumSub(ctx, l.wake).Result(); err == nil && n[l.wake] == 1 {
				r.waiting = l
				break
			}
		}
		t.Cleanup(func() {
			ostop()
			<-got
			held.Release(ctx)
		})
		if r.waiting == nil {
			l.Close()
		}
	}
	t.Cleanup(func() { r.waiting.Close() })
	return r
}

// take has the holder take k.
func (r *removalRig) take(k string) driver.Lease {
	r.t.Helper()
	le, err := r.holder.Acquire(context.Background(), k, driver.AcquireOptions{TTL: removalTTL})
	if err != nil {
		r.t.Fatal(err)
	}
	return le
}

// wait starts l's waiting acquisition of k, for as long as ctx lasts, and
// returns once the waiter is recorded.
func (r *removalRig) wait(ctx context.Context, l *Locker, k string) <-chan acquired {
	r.t.Helper()
	got := make(chan acquired, 1)
	go func() {
		le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: removalTTL, Wait: true})
		got <- acquired{le, err}
	}()
	_, waiters := lockWaitersOf(k)
	eventually(r.t, "the waiter for "+k+" recorded", func() bool {
		n, err := r.holder.client.ZCard(context.Background(), waiters).Result()
		return err == nil && n == 1
	})
	return got
}

// keyOff is the i-th key whose slot is not on d.
func (r *removalRig) keyOff(i int) string {
	for n := 0; ; n++ {
		if k := fmt.Sprintf("reshard/wakeup/%d/%d", i, n); r.c.owner(r.c.slot(lockKeyOf(k))) != r.d {
			return k
		}
	}
}

// empty moves every slot off d, which stays a member.
func (r *removalRig) empty() {
	for _, slot := range r.onD {
		r.c.moveSlot(slot, r.d, r.c.shards[0], 10, nil)
	}
}

// woken returns the lease that got brings, which a release at since
// handed to its waiter.
func woken(t *testing.T, what string, got <-chan acquired, since time.Time, ttl time.Duration) driver.Lease {
	t.Helper()
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		t.Logf("%s: the waiter had the lock %v after its release", what, time.Since(since).Round(time.Millisecond))
		return a.lease
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the waiter did not have the lock within 5s of its release (a lost wake-up waits %v)", what, lostWakeup(ttl))
	}
	return nil
}

// TestProbeThroughPausedMaster: a Locker's waiters share one Pub/Sub
// connection, on the master of the first channel's slot; after a silence
// the notifier probes it by a message published from another master, here
// the master of its own channel's slot. While that other master is
// paused, the probe is not sent, which says nothing of the connection: it
// must be kept (replacing it would lose the messages of the gap), its own
// node pinged instead.
func TestProbeThroughPausedMaster(t *testing.T) {
	c := startReshardCluster(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder := newLocker(t, c.client())
	// The connection goes to the master of key's slot; or, when go-redis
	// dials it before the first SUBSCRIBE is written, to any node the
	// client knows: another Locker is made then, for another key.
	var (
		l         *Locker
		probeNode *shard
	)
	for attempt := 1; l == nil; attempt++ {
		if attempt > 5 {
			t.Fatal("the waiters' connection was made to the master of the probe's slot 5 times")
		}
		m := newLocker(t, c.client())
		probeNode = c.owner(c.slot(m.wake))
		var key string
		for i := 0; ; i++ {
			key = fmt.Sprintf("reshard/probe/%d/%d", attempt, i)
			if c.owner(c.slot(lockKeyOf(key))) != probeNode {
				break
			}
		}
		// A writer holds key, whose reader subscribes first; a plain
		// lock's waiter adds the Locker's own channel, the probe's.
		if _, err := holder.AcquireWrite(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		go m.AcquireRead(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true})
		eventually(t, "the reader subscribed", confirmedSubs(m, 1))
		go m.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true})
		eventually(t, "the plain waiter subscribed", confirmedSubs(m, 2))
		if n, err := probeNode.admin.PubSubNumSub(ctx, m.wake).Result(); err != nil {
			t.Fatal(err)
		} else if n[m.wake] == 0 {
			l = m
		}
	}
	l.notify.mu.Lock()
	ps := l.notify.ps
	l.notify.mu.Unlock()
	c.must(probeNode, "CLIENT", "PAUSE", 4000, "ALL")
	// Answered once the pause is over.
	c.must(probeNode, "PING")
	l.notify.mu.Lock()
	kept := l.notify.ps == ps
	l.notify.mu.Unlock()
	if !kept {
		t.Error("the connection was replaced while another master than its own was paused")
	}
}

// confirmedSubs reports whether l's notifier has n confirmed
// subscriptions.
func confirmedSubs(l *Locker, n int) func() bool {
	return func() bool {
		l.notify.mu.Lock()
		defer l.notify.mu.Unlock()
		k := 0
		for _, s := range l.notify.subs {
			if s.isReady {
				k++
			}
		}
		return k == n
	}
}

// TestProbeCommands: on a Cluster, the probe of a Locker's Pub/Sub
// connection, sent after each silent second while a plain lock's waiter
// sleeps, costs the servers one command, a PUBLISH from another master
// than the connection's, as a PING does on a single server: no script
// (EVALSHA, and the PUBLISH it runs), and nothing else.
func TestProbeCommands(t *testing.T) {
	c := startReshardCluster(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder := newLocker(t, c.client())
	// A waiter that comes back to renew its record only after a quarter of
	// the TTL, long after the test.
	l := newLocker(t, c.client(), WithWaiterTimeout(time.Hour))
	opts := driver.AcquireOptions{TTL: time.Hour}
	if _, err := holder.Acquire(ctx, "probe/commands", opts); err != nil {
		t.Fatal(err)
	}
	opts.Wait = true
	go l.Acquire(ctx, "probe/commands", opts)
	eventually(t, "the waiter's subscription confirmed", func() bool {
		l.notify.mu.Lock()
		defer l.notify.mu.Unlock()
		s := l.notify.subs[l.wake]
		return s != nil && s.isReady
	})
	calls := func() map[string]int64 {
		all := map[string]int64{}
		for _, s := range c.shards {
			for name, n := range serverCalls(t, s.admin) {
				all[name] += n
			}
		}
		return all
	}
	before := calls()
	const probes = 5
	var after map[string]int64
	eventually(t, fmt.Sprintf("%d probes published", probes), func() bool {
		after = calls()
		return after["publish"]-before["publish"] >= probes
	})
	for name, n := range after {
		// The client loads its slot map again a minute after the last
		// time, and dials the master it publishes from (HELLO) the first
		// time, and again when it finds out that it had chosen the
		// connection's.
		if d := n - before[name]; d > 0 && name != "info" && name != "publish" && name != "cluster|slots" && name != "hello" {
			t.Errorf("%d probes cost %d %s", after["publish"]-before["publish"], d, name)
		}
	}
}

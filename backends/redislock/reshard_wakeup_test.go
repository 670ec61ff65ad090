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
	c := startReshardCluster(t, 3)
	d := c.add()
	holder := newLocker(t, c.client())
	ctx := context.Background()
	const ttl = time.Minute
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	take := func(k string) driver.Lease {
		t.Helper()
		le, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return le
	}
	// wait starts l's waiting acquisition of k, and returns once the
	// waiter is recorded.
	wait := func(ctx context.Context, l *Locker, k string) <-chan acquired {
		t.Helper()
		got := make(chan acquired, 1)
		go func() {
			le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: ttl, Wait: true})
			got <- acquired{le, err}
		}()
		_, waiters := lockWaitersOf(k)
		eventually(t, "the waiter for "+k+" recorded", func() bool {
			n, err := holder.client.ZCard(ctx, waiters).Result()
			return err == nil && n == 1
		})
		return got
	}
	// keyOff is the i-th key whose slot is not on d.
	keyOff := func(i int) string {
		for n := 0; ; n++ {
			if k := fmt.Sprintf("reshard/wakeup/%d/%d", i, n); c.owner(c.slot(lockKeyOf(k))) != d {
				return k
			}
		}
	}

	// The waiting Locker's Pub/Sub connection goes to the master of its
	// channel's slot, put on d; or, when go-redis dials it before the
	// first SUBSCRIBE is written, to any node the client knows: another
	// Locker is made then. A waiter for another key keeps the connection
	// for the whole test.
	var (
		waiting   *Locker
		onD       []int // the slots moved to d
		heldOther driver.Lease
		gotOther  <-chan acquired
	)
	for attempt := 1; waiting == nil; attempt++ {
		if attempt > 5 {
			t.Fatalf("the waiter's connection was made to another node than %s 5 times", d.addr)
		}
		// A long waiter timeout: the waiter comes back to renew its
		// record only after the quarter of the TTL that bounds a lost
		// wake-up.
		l, err := New(c.client(), WithWaiterTimeout(90*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		slot := c.slot(l.wake)
		if src := c.owner(slot); src != d {
			c.moveSlot(slot, src, d, 10, nil)
			onD = append(onD, slot)
		}
		// The client may have loaded the slots before they moved.
		cc := l.client.(*goredis.ClusterClient)
		eventually(t, "the waiter's client sees its channel's slot on "+d.addr, func() bool {
			cc.ReloadState(ctx)
			m, err := cc.MasterForKey(ctx, l.wake)
			return err == nil && m.Options().Addr == d.addr
		})
		other := keyOff(attempt)
		held := take(other)
		octx, ostop := context.WithCancel(wctx)
		got := wait(octx, l, other)
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if n, err := d.admin.PubSubNumSub(ctx, l.wake).Result(); err == nil && n[l.wake] == 1 {
				waiting, heldOther, gotOther = l, held, got
				break
			}
		}
		if waiting == nil {
			ostop()
			<-got
			l.Close()
			held.Release(ctx)
		}
		t.Cleanup(ostop)
	}
	t.Cleanup(func() { waiting.Close() })
	key := keyOff(0)
	held := take(key)
	got := wait(wctx, waiting, key)

	// Every slot leaves d, which stays a member.
	for _, slot := range onD {
		c.moveSlot(slot, d, c.shards[0], 10, nil)
	}
	at := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mine := woken(t, "the channel's slot moved away from the waiter's node", got, at, ttl)
	if err := mine.Release(ctx); err != nil {
		t.Fatal(err)
	}

	held = take(key)
	got = wait(wctx, waiting, key)
	c.remove(d)
	at = time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mine = woken(t, "the waiter's node removed", got, at, ttl)
	if err := mine.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
	<-gotOther
	heldOther.Release(ctx)
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
// the notifier probes it by a message published through the master of its
// own channel's slot, another one here. While that other master is paused,
// the probe is not sent, which says nothing of the connection: it must be
// kept (replacing it would lose the messages of the gap), its own node
// pinged instead.
func TestProbeThroughPausedMaster(t *testing.T) {
	c := startReshardCluster(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := newLocker(t, c.client())
	probeNode := c.owner(c.slot(l.wake))
	var key string
	for i := 0; ; i++ {
		key = fmt.Sprintf("reshard/probe/%d", i)
		if c.owner(c.slot(lockKeyOf(key))) != probeNode {
			break
		}
	}
	holder := newLocker(t, c.client())
	// A writer holds key, whose reader subscribes first (the connection
	// goes to key's master); a plain lock's waiter adds the Locker's own
	// channel, the probe's.
	if _, err := holder.AcquireWrite(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	go l.AcquireRead(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true})
	ready := func(n int) func() bool {
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
	eventually(t, "the reader subscribed", ready(1))
	go l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true})
	eventually(t, "the plain waiter subscribed", ready(2))
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

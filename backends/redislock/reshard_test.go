package redislock

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// The tests of this file move slots between the masters of a Redis Cluster
// of their own (reshardCluster) while locks are held, waited for and
// released, as an operator's redis-cli --cluster reshard, rebalance,
// add-node and del-node do.

// reshardMode is one kind of lease, and the kind a holder of it keeps out.
type reshardMode struct {
	name           string
	acquire, rival func(ctx context.Context, l *Locker, key string, wait bool) (driver.Lease, error)
}

func reshardModes(ttl time.Duration) []reshardMode {
	opts := func(wait bool) driver.AcquireOptions { return driver.AcquireOptions{TTL: ttl, Wait: wait} }
	plain := func(ctx context.Context, l *Locker, key string, wait bool) (driver.Lease, error) {
		return l.Acquire(ctx, key, opts(wait))
	}
	fair := func(ctx context.Context, l *Locker, key string, wait bool) (driver.Lease, error) {
		return l.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Wait: wait, Fair: true})
	}
	read := func(ctx context.Context, l *Locker, key string, wait bool) (driver.Lease, error) {
		return l.AcquireRead(ctx, key, opts(wait))
	}
	write := func(ctx context.Context, l *Locker, key string, wait bool) (driver.Lease, error) {
		return l.AcquireWrite(ctx, key, opts(wait))
	}
	permit := func(ctx context.Context, l *Locker, key string, wait bool) (driver.Lease, error) {
		return l.AcquireSemaphore(ctx, key, 1, opts(wait))
	}
	return []reshardMode{
		{name: "plain", acquire: plain, rival: plain},
		{name: "fair", acquire: fair, rival: fair},
		{name: "write", acquire: write, rival: read},
		{name: "read", acquire: read, rival: write},
		{name: "semaphore", acquire: permit, rival: permit},
	}
}

type acquired struct {
	lease driver.Lease
	err   error
}

// TestReshardHeldLeases: a lease of every kind is held while its slot
// moves to another master one key at a time, and back, with a rival
// waiting for it. At every step of the move, with the slot's keys split
// between the two nodes, the lease is renewed, alone and in a batch, and a
// newcomer that does not wait is refused; the release, sent while the slot
// moves back, frees it, and the waiting rival gets it with a greater token.
func TestReshardHeldLeases(t *testing.T) {
	c := startReshardCluster(t, 3)
	ctx := context.Background()
	const ttl = 20 * time.Second
	for _, m := range reshardModes(ttl) {
		t.Run(m.name, func(t *testing.T) {
			l, rival, newcomer := newLocker(t, c.client()), newLocker(t, c.client()), newLocker(t, c.client())
			key := "reshard/held/" + m.name
			lease, err := m.acquire(ctx, l, key, false)
			if err != nil {
				t.Fatal(err)
			}
			wctx, stop := context.WithTimeout(ctx, 60*time.Second)
			defer stop()
			waited := make(chan acquired, 1)
			go func() {
				le, err := m.rival(wctx, rival, key, true)
				waited <- acquired{le, err}
			}()
			slot := c.slot(lockKeyOf(key))
			src := c.owner(slot)
			step := 0
			check := func() {
				step++
				if err := lease.Refresh(ctx, ttl); err != nil {
					t.Errorf("step %d: Refresh: %v", step, err)
				}
				if errs := l.RefreshBatch(ctx, []driver.Lease{lease}, ttl); errs[0] != nil {
					t.Errorf("step %d: RefreshBatch: %v", step, errs[0])
				}
				tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				le, err := m.rival(tctx, newcomer, key, false)
				if err == nil {
					t.Errorf("step %d: a newcomer was granted token %d while lease %d was held", step, le.Token(), lease.Token())
					le.Release(ctx)
				}
			}
			c.moveSlot(slot, src, c.other(src), 1, check)
			check()
			released := make(chan error, 1)
			calls := 0
			c.moveSlot(slot, c.owner(slot), src, 1, func() {
				// After the first key moved: a release that names
				// several keys is answered TRYAGAIN until the last did.
				if calls++; calls == 2 {
					go func() {
						rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
						defer cancel()
						released <- lease.Release(rctx)
					}()
				}
			})
			if err := <-released; err != nil {
				t.Fatalf("a release sent while the slot moved: %v", err)
			}
			select {
			case w := <-waited:
				if w.err != nil {
					t.Fatalf("the waiting rival: %v", w.err)
				}
				if w.lease.Token() <= lease.Token() {
					t.Errorf("the rival was granted token %d after the release of %d", w.lease.Token(), lease.Token())
				}
				if err := w.lease.Release(ctx); err != nil {
					t.Error(err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the waiting rival did not get the lease within 30s of its release")
			}
			t.Logf("%d steps on the way out, %d back", step, calls)
		})
	}
}

// TestReshardStore: an idempotency record claimed before its slot moves is
// extended at every step of the move and refused to another claimant, and
// completed while the slot moves back; the completed record is found
// after, with its response.
func TestReshardStore(t *testing.T) {
	c := startReshardCluster(t, 2)
	s, other := newStore(t, c.client()), newStore(t, c.client())
	ctx := context.Background()
	const lease = 20 * time.Second
	claim := idempotency.Claim{Scope: "s", Key: "reshard/store", Fingerprint: "f", Owner: "first", Lease: lease}
	if rec, err := s.Claim(ctx, claim); err != nil || rec != nil {
		t.Fatalf("Claim: %v, %v", rec, err)
	}
	slot := c.slot(s.recordKey(claim.Scope, claim.Key))
	src := c.owner(slot)
	step := 0
	c.moveSlot(slot, src, c.other(src), 1, func() {
		step++
		if err := s.Extend(ctx, claim.Scope, claim.Key, claim.Owner, lease); err != nil {
			t.Errorf("step %d: Extend: %v", step, err)
		}
		second := claim
		second.Owner = "second"
		if rec, err := other.Claim(ctx, second); err != nil || rec == nil || rec.Owner != claim.Owner {
			t.Errorf("step %d: a second Claim answered %+v, %v, want the first's record", step, rec, err)
		}
	})
	completed := make(chan error, 1)
	calls := 0
	c.moveSlot(slot, c.owner(slot), src, 1, func() {
		if calls++; calls == 2 {
			go func() {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				completed <- s.Complete(cctx, claim.Scope, claim.Key, claim.Owner, []byte("done"), lease)
			}()
		}
	})
	if err := <-completed; err != nil {
		t.Fatalf("Complete while the slot moved: %v", err)
	}
	rec, err := other.Get(ctx, claim.Scope, claim.Key)
	if err != nil || rec.State != idempotency.StateCompleted || string(rec.Response) != "done" {
		t.Fatalf("Get after the moves: %+v, %v, want the completed record", rec, err)
	}
}

// TestReshardWithoutRedirects: with a client that follows no redirection
// (MaxRedirects -1), a key on the target of an open slot is reached only by
// an ASK the client does not follow. Renewals, acquisitions and releases
// then fail as unavailable, within their ctx, without saying the lease was
// lost or granting it, and work again once the slot has settled.
func TestReshardWithoutRedirects(t *testing.T) {
	c := startReshardCluster(t, 2)
	cc := c.client(func(o *goredis.ClusterOptions) { o.MaxRedirects = -1 })
	l, newcomer := newLocker(t, cc), newLocker(t, cc)
	ctx := context.Background()
	const ttl = 20 * time.Second
	key := "reshard/no-redirects"
	lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	unavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, driver.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s while the slot is open: %v, want it unavailable", what, err)
		}
	}
	within := func(f func(ctx context.Context) error) error {
		tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := f(tctx)
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("a call with a 500ms ctx returned after %v", d)
		}
		return err
	}
	slot := c.slot(lockKeyOf(key))
	src := c.owner(slot)
	calls := 0
	c.moveSlot(slot, src, c.other(src), 1, func() {
		// Once the lock's key is on the target: the source answers ASK.
		if calls++; calls != 2 {
			return
		}
		unavailable("Refresh", within(func(ctx context.Context) error { return lease.Refresh(ctx, ttl) }))
		unavailable("RefreshBatch", within(func(ctx context.Context) error {
			return l.RefreshBatch(ctx, []driver.Lease{lease}, ttl)[0]
		}))
		unavailable("Acquire", within(func(ctx context.Context) error {
			le, err := newcomer.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl})
			if err == nil {
				t.Errorf("a newcomer was granted %d while %d was held", le.Token(), lease.Token())
			}
			return err
		}))
		unavailable("Release", within(lease.Release))
	})
	if err := lease.Refresh(ctx, ttl); err != nil {
		t.Fatalf("Refresh once the slot settled: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release once the slot settled: %v", err)
	}
}

// TestReshardReleaseOfLastMember: a read lease or a permit, the only member
// of its sorted set, released on the source node of a slot being moved.
// Its removal empties the set, which Redis deletes, and there a command on
// the set after that fails the script (the key is no longer local to the
// node, as Redis counts a migrating slot's keys), after the removal and
// before the wake-up: the release must answer that it released, and wake.
func TestReshardReleaseOfLastMember(t *testing.T) {
	c := startReshardCluster(t, 2)
	ctx := context.Background()
	const ttl = 20 * time.Second
	for _, m := range reshardModes(ttl) {
		if m.name != "read" && m.name != "semaphore" {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			l := newLocker(t, c.client())
			key := "reshard/last/" + m.name
			lease, err := m.acquire(ctx, l, key, false)
			if err != nil {
				t.Fatal(err)
			}
			releaseOnSource(t, c, key, lease)
			next, err := m.acquire(ctx, l, key, false)
			if err != nil {
				t.Fatalf("an acquisition after the move: %v", err)
			}
			if next.Token() <= lease.Token() {
				t.Errorf("token %d after %d", next.Token(), lease.Token())
			}
			if err := next.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestReshardReleaseWithLapsedWaiter: a plain lock whose waiter announced
// itself is released on the source node of a slot being moved, with only a
// lapsed waiter's record left (its process died). The release takes the
// record out, which empties the set, which Redis deletes, and there a
// command on the set after that fails the script, after the lock was freed
// and before the wake-up: the release must answer that it released.
func TestReshardReleaseWithLapsedWaiter(t *testing.T) {
	c := startReshardCluster(t, 2)
	ctx := context.Background()
	l, w := newLocker(t, c.client()), newLocker(t, c.client())
	key := "reshard/lapsed"
	lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A waiter announces itself in the lock's state, and gives up.
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if _, err := w.Acquire(wctx, key, driver.AcquireOptions{TTL: time.Second, Wait: true}); err == nil {
		t.Fatal("the waiter was granted a held lock")
	}
	cancel()
	// The record of a waiter that died, long lapsed.
	_, waiters := lockWaitersOf(key)
	eventually(t, "the waiter's own record taken out", func() bool {
		n, err := w.client.ZCard(ctx, waiters).Result()
		return err == nil && n == 0
	})
	if err := w.client.ZAdd(ctx, waiters, goredis.Z{Score: 1, Member: "warden:wake:gone\n1000\nghost"}).Err(); err != nil {
		t.Fatal(err)
	}
	releaseOnSource(t, c, key, lease)
	next, err := w.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatalf("an acquisition after the move: %v", err)
	}
	next.Release(ctx)
}

// releaseOnSource moves the slot of key to another master, releasing lease
// once the slot is open, its keys still on the source.
func releaseOnSource(t *testing.T, c *reshardCluster, key string, lease driver.Lease) {
	t.Helper()
	slot := c.slot(lockKeyOf(key))
	src := c.owner(slot)
	first := true
	c.moveSlot(slot, src, c.other(src), 10, func() {
		if first {
			first = false
			if err := lease.Release(context.Background()); err != nil {
				t.Errorf("a release on the source of its open slot: %v", err)
			}
		}
	})
}

// TestReshardLateReleaseOfTakenLock: a plain lock whose lease lapsed and
// was taken by a waiter (B), another waiter recorded, is released late by
// its former holder on the source node of its slot being moved. The
// release takes the other waiter's record, the last, to hand the lock to,
// which empties the set, which Redis deletes; its grant finds B's state,
// and a command on the set after that fails there: the script must have
// put B's state back before, and no newcomer may be granted the lock.
func TestReshardLateReleaseOfTakenLock(t *testing.T) {
	c := startReshardCluster(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := "reshard/late"
	lock, waiters := lockWaitersOf(key)
	slot := c.slot(lock)
	src := c.owner(slot)
	recorded := func() bool { n, err := c.do(src, "ZCARD", waiters).Int64(); return err == nil && n == 1 }
	first, err := newLocker(t, c.client()).Acquire(ctx, key, driver.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A waits, and is handed the lock with a lease of a second.
	gotA := make(chan acquired, 1)
	go func() {
		le, err := newLocker(t, c.client()).Acquire(ctx, key, driver.AcquireOptions{TTL: time.Second, Wait: true})
		gotA <- acquired{le, err}
	}()
	eventually(t, "A recorded", recorded)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-gotA
	if a.err != nil {
		t.Fatal(a.err)
	}
	// Two more wait; A's lease lapses, one of them (B) takes the lock, the
	// other stays recorded.
	got := make(chan acquired, 2)
	for range 2 {
		go func() {
			le, err := newLocker(t, c.client()).Acquire(ctx, key, driver.AcquireOptions{TTL: 30 * time.Second, Wait: true})
			got <- acquired{le, err}
		}()
	}
	b := <-got
	if b.err != nil {
		t.Fatal(b.err)
	}
	eventually(t, "the other waiter recorded", recorded)
	newcomer := newLocker(t, c.client())
	once := true
	c.moveSlot(slot, src, c.other(src), 10, func() {
		if !once {
			return
		}
		once = false
		if err := a.lease.Release(ctx); err == nil {
			t.Error("the release of a lapsed lease, which B holds, answered that it released")
		}
		if n, err := newcomer.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Second}); err == nil {
			t.Errorf("a newcomer was granted token %d while B holds token %d", n.Token(), b.lease.Token())
		}
	})
	if err := b.lease.Refresh(ctx, 30*time.Second); err != nil {
		t.Errorf("B's refresh once the slot moved: %v", err)
	}
}

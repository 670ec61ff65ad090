package redislock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestHandoff: a release hands the lock to the waiter recorded for it,
// which learns its token from the release's message and makes no attempt
// of its own; the releaser, coming straight back, finds the lock held. The
// waiter counts its lease from the send time of its last refused attempt,
// not from the message: its expiry is before the server's deadline, and a
// quarter second before what the message's arrival would give.
func TestHandoff(t *testing.T) {
	admin, addr := privateClient(t)
	holder := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	waiter := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	ctx := context.Background()
	const key, ttl = "handoff", 10 * time.Second
	opts := driver.AcquireOptions{TTL: ttl, Wait: true, Owner: "holder"}
	held, err := holder.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease driver.Lease
		err   error
	}
	granted := make(chan result, 1)
	start := time.Now()
	go func() {
		wopts := opts
		wopts.Owner = "waiter"
		le, err := waiter.Acquire(ctx, key, wopts)
		granted <- result{le, err}
	}()
	eventually(t, "the waiter recorded", func() bool {
		n, _ := admin.ZCard(ctx, namesOf(key).waiters()).Result()
		return n == 1
	})
	// Once its subscription is confirmed, the waiter tries once more, then
	// sleeps for a quarter of the TTL, far beyond this test.
	eventually(t, "the waiter's Locker subscribed", func() bool {
		subs, err := admin.PubSubNumSub(ctx, waiter.wake).Result()
		return err == nil && subs[waiter.wake] == 1
	})
	time.Sleep(100 * time.Millisecond)
	recorded := time.Now()
	time.Sleep(300 * time.Millisecond)
	before := serverCalls(t, admin)
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-granted
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	after := serverCalls(t, admin)
	if n := after["evalsha"] - before["evalsha"]; n != 1 {
		t.Errorf("%d scripts run from the release to the waiter's grant, want 1 (the release)", n)
	}
	if r.lease.Token() <= held.Token() {
		t.Errorf("the waiter's token %d, not past the releaser's %d", r.lease.Token(), held.Token())
	}
	exp := r.lease.Expiry()
	if exp.Before(start.Add(ttl-time.Second)) || exp.After(recorded.Add(ttl)) {
		t.Errorf("the waiter's expiry is %v after it started, want from its last attempt (before %v)",
			exp.Sub(start), recorded.Sub(start))
	}
	if late := released.Add(ttl).Sub(exp); late < 250*time.Millisecond {
		t.Errorf("the waiter's expiry is only %v before the release plus the TTL: counted from the message?", late)
	}
	sent := time.Now()
	in, err := holder.Inspect(ctx, key)
	if err != nil || len(in.Holders) != 1 {
		t.Fatalf("inspect: %+v, %v", in, err)
	}
	if h := in.Holders[0]; h.Owner != "waiter" || h.Token != r.lease.Token() {
		t.Errorf("the lock's holder: %+v, want the waiter with token %d", h, r.lease.Token())
	}
	// The server's deadline, from the inspection sent at sent, is past the
	// waiter's expiry (pttl is in whole milliseconds).
	if deadline := sent.Add(in.Holders[0].TTL + time.Millisecond); deadline.Before(exp) {
		t.Errorf("the server's deadline is %v before the waiter's expiry", exp.Sub(deadline))
	}
	if _, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("the releaser coming back: %v, want ErrNotAcquired", err)
	}
	if err := r.lease.Refresh(ctx, ttl); err != nil {
		t.Errorf("the waiter's refresh: %v", err)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Errorf("the waiter's release: %v", err)
	}
}

// TestHandoffToDeadWaiter: a waiter that died with its record alive can be
// handed the lock, which it then holds for its TTL, as a holder that died
// would; a record whose waiter timeout passed is not handed anything.
func TestHandoffToDeadWaiter(t *testing.T) {
	c, _ := privateClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	const key, deadTTL = "dead-waiter", 400 * time.Millisecond
	n := mutexNamesOf(key)
	// record runs a waiting attempt for a contender whose channel nobody
	// listens to, with the given waiter timeout.
	record := func(owner string, timeout time.Duration) {
		t.Helper()
		rec := "warden:wake:nobody\n400\n" + owner
		r, err := run(ctx, l.sc, l.s.acquire, []string{n.lock, n.waiters}, owner, 400, "1", strconv.FormatInt(timeout.Milliseconds(), 10)+"\n"+rec, "0")
		if err != nil || r[0] != 0 {
			t.Fatalf("the dead waiter's attempt: %v, %v", r, err)
		}
	}
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}

	held, err := l.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	record("DEADOWNER/dead", time.Minute)
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	in, err := l.Inspect(ctx, key)
	if err != nil || len(in.Holders) != 1 || in.Holders[0].Owner != "dead" {
		t.Fatalf("after the release: %+v, %v; want the dead waiter holding", in, err)
	}
	le, err := l.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(released)
	if took < deadTTL-50*time.Millisecond || took > deadTTL+500*time.Millisecond {
		t.Errorf("a live contender got the lock %v after it was handed to a dead waiter with a %v TTL", took, deadTTL)
	}
	if le.Token() <= held.Token() {
		t.Errorf("token %d after %d", le.Token(), held.Token())
	}

	record("DEADOWNER2/late", 100*time.Millisecond)
	time.Sleep(150 * time.Millisecond)
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if in, err := l.Inspect(ctx, key); err != nil || len(in.Holders) != 0 {
		t.Fatalf("after a release with only a lapsed record: %+v, %v; want the lock free", in, err)
	}
}

// TestHandoffEarlierRecord: a record of an earlier version, which says no
// TTL, is not handed the lock (its waiter would not know it holds it): it
// is woken as before, with the lock left free, and keeps its place.
func TestHandoffEarlierRecord(t *testing.T) {
	c, _ := privateClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	const key = "earlier-record"
	n := mutexNamesOf(key)
	ps := c.Subscribe(ctx, "earlier-channel")
	t.Cleanup(func() { ps.Close() })
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := "earlier-channel\nEARLIEROWNER"
	if r, err := run(ctx, l.sc, l.s.acquire, []string{n.lock, n.waiters}, "EARLIEROWNER", 10000, "1", "60000\n"+rec, "0"); err != nil || r[0] != 0 {
		t.Fatalf("the earlier waiter's attempt: %v, %v", r, err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := ps.ReceiveMessage(rctx)
	if err != nil || m.Payload != rec {
		t.Fatalf("the earlier waiter's message: %+v, %v; want its record", m, err)
	}
	if in, err := l.Inspect(ctx, key); err != nil || len(in.Holders) != 0 {
		t.Fatalf("after the release: %+v, %v; want the lock free", in, err)
	}
	if _, err := c.ZScore(ctx, n.waiters, rec).Result(); err != nil {
		t.Fatalf("the earlier waiter's record after the release: %v", err)
	}
}

// TestHandedOver: a grant from a message is taken only with a refused
// attempt to count the lease from, recent enough, that found a token below
// the grant's (a grant with a token not past it was made before that
// attempt ran, and arrived late), and without WithWaitReplicas; the lease
// then expires the TTL after that attempt was sent (less the allowance),
// whenever the message came.
func TestHandedOver(t *testing.T) {
	const ttl = 10 * time.Second
	now := time.Now()
	cases := []struct {
		name     string
		msg      string
		refused  time.Time
		found    uint64 // the token the refused attempt found
		replicas int
		want     bool
	}{
		{"a grant", "1234:20500:1", now.Add(-time.Second), 1233, 0, true},
		{"a wake-up", "", now.Add(-time.Second), 1233, 0, false},
		{"no refused attempt", "1234:20500:1", time.Time{}, 1233, 0, false},
		{"a refused attempt too old", "1234:20500:1", now.Add(-ttl/2 - time.Second), 1233, 0, false},
		{"a refused attempt that found no token", "1234:20500:1", now.Add(-time.Second), 0, 0, false},
		{"a grant made before the refused attempt", "1234:20500:1", now.Add(-time.Second), 1234, 0, false},
		{"a grant older than the holder the refusal found", "1234:20500:1", now.Add(-time.Second), 1300, 0, false},
		{"WithWaitReplicas", "1234:20500:1", now.Add(-time.Second), 1233, 1, false},
		{"a bad token", "x:20500:1", now.Add(-time.Second), 1233, 0, false},
		{"a bad flag", "1234:20500:3", now.Add(-time.Second), 1233, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := &Locker{cfg: config{replicas: c.replicas}}
			ls := &lease{l: l, kind: kindMutex}
			if got := l.handedOver(ls, c.msg, c.refused, c.found, ttl); got != c.want {
				t.Fatalf("handedOver: %v, want %v", got, c.want)
			}
			if !c.want {
				return
			}
			if ls.token != 1234 || ls.day.Load() != 20500 || ls.waiting != 1 {
				t.Errorf("lease: token %d, day %d, waiting %d; want 1234, 20500, 1", ls.token, ls.day.Load(), ls.waiting)
			}
			if want := c.refused.Add(ttl - expiryAllowance); !ls.Expiry().Equal(want) {
				t.Errorf("expiry %v after the refused attempt, want %v", ls.Expiry().Sub(c.refused), want.Sub(c.refused))
			}
		})
	}
}

// TestReleaseWakesFairWaiter: a plain lock granted with nobody waiting is
// released with the lock's and the waiters' keys alone (see
// release_head.lua); a fair waiter that queued on the same key meanwhile
// must still be woken by that release, not left to come back by itself (a
// quarter of the TTL here, its waiter timeout being far longer).
func TestReleaseWakesFairWaiter(t *testing.T) {
	admin, addr := privateClient(t)
	holder := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	waiter := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}), WithWaiterTimeout(time.Minute))
	ctx := context.Background()
	const key, ttl = "plain-then-fair", 10 * time.Second
	held, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease driver.Lease
		err   error
		at    time.Time
	}
	granted := make(chan result, 1)
	go func() {
		le, err := waiter.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Wait: true, Fair: true})
		granted <- result{le, err, time.Now()}
	}()
	eventually(t, "the fair waiter queued", func() bool {
		n, _ := admin.LLen(ctx, namesOf(key).queue()).Result()
		return n == 1
	})
	eventually(t, "the waiter's Locker subscribed", func() bool {
		subs, err := admin.PubSubNumSub(ctx, waiter.wake).Result()
		return err == nil && subs[waiter.wake] == 1
	})
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-granted:
		if r.err != nil {
			t.Fatalf("the fair waiter: %v", r.err)
		}
		if d := r.at.Sub(released); d > time.Second {
			t.Errorf("the fair waiter got the lock %v after the release: not woken by it", d)
		}
		if r.lease.Token() <= held.Token() {
			t.Errorf("the fair waiter's token %d, not past the holder's %d", r.lease.Token(), held.Token())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the fair waiter never got the lock")
	}
}

// TestTimedOutWaiterLeavesNoRecord: a waiter whose context ends takes its
// record out before its Acquire returns, so that a process that closes
// its client (or exits) right after a timed-out Lock leaves nothing for
// the next release to hand the lock to, which would then stay with nobody
// for a whole TTL.
func TestTimedOutWaiterLeavesNoRecord(t *testing.T) {
	ctx := context.Background()
	key := fmt.Sprintf("timed-out-waiter-%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}
	holder := newLocker(t, newClient(t))
	held, err := holder.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		addr := drivertest.Addr(t, addrEnv, addrDefault)
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		l, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = l.Acquire(wctx, key, opts)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiter %d: %v, want its context's deadline", i, err)
		}
		l.Close()
		c.Close()
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := newLocker(t, newClient(t))
	le, err := other.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Second})
	if err != nil {
		in, _ := other.Inspect(ctx, key)
		t.Fatalf("after the holder's release: %v (holders %+v); want the lock free, not handed to a waiter that had gone", err, in.Holders)
	}
	le.Release(ctx)
}

// cleanupWhere is a go-redis hook that records where a failed
// acquisition's cleanup sends its commands: on the acquisition's own
// goroutine (its first try) or on one of its own (the retry).
type cleanupWhere struct{ inline, behind atomic.Int32 }

func (h *cleanupWhere) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *cleanupWhere) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		buf := make([]byte, 16<<10)
		stack := string(buf[:runtime.Stack(buf, false)])
		switch {
		case strings.Contains(stack, "redislock.(*Locker).cleanUp.func"):
			h.behind.Add(1)
		case strings.Contains(stack, "redislock.(*Locker).cleanUp("):
			h.inline.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *cleanupWhere) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestCleanupTriedInlineOnlyWhenAnswered: a waiter whose context ends
// while the server answers cleans up on its own goroutine before Acquire
// returns; one whose server stopped answering leaves the cleanup to a
// goroutine of its own, so that it returns at its deadline: a try there
// would take the time guard keeps for the last attempt of a bounded wait,
// which tells a server out of reach from a lock held (with it, waits of up
// to 100 ms on a closed port or a hung server were all reported as the
// lock held).
func TestCleanupTriedInlineOnlyWhenAnswered(t *testing.T) {
	addr := drivertest.Addr(t, addrEnv, addrDefault)
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}
	wait := func(server, key string) *cleanupWhere {
		t.Helper()
		c := goredis.NewClient(&goredis.Options{Addr: server, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		h := &cleanupWhere{}
		c.AddHook(h)
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if _, err := newLocker(t, c).Acquire(wctx, key, opts); err == nil {
			t.Fatalf("%s: acquired", server)
		}
		return h
	}

	key := fmt.Sprintf("cleanup-where-%d", time.Now().UnixNano())
	held, err := newLocker(t, newClient(t)).Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	// (A try that takes more than cleanupTry on a busy machine is retried
	// behind: only the try is certain.)
	if h := wait(addr, key); h.inline.Load() == 0 {
		t.Errorf("answering server: no cleanup command inline (%d behind); want its first try inline", h.behind.Load())
	}

	p := drivertest.StartProxy(t, addr)
	p.Blackhole()
	h := wait(p.Addr(), key)
	eventually(t, "the cleanup's retry", func() bool { return h.behind.Load() > 0 })
	if n := h.inline.Load(); n != 0 {
		t.Errorf("hung server: %d cleanup commands inline; want none", n)
	}
}

package guard_test

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// slack is what guard may add to a caller's bound: the grace it gives a
// backend to answer for itself. Under synctest only fake time passes, so the
// figure is exact, however busy the machine.
const slack = 50 * time.Millisecond

// hanging is a backend whose server accepts requests and never answers,
// behind a client that ignores contexts (go-redis with its default options
// on a hung connection): every call blocks until the test lets the answers
// through, and then does what it was asked, on the memory backend behind
// it. It does not declare driver.ContextBounded.
type hanging struct {
	mem      *memory.Locker
	answer   chan struct{}
	granted  atomic.Int32
	released atomic.Int32
}

func newHanging() *hanging { return &hanging{mem: memory.New(), answer: make(chan struct{})} }

func (h *hanging) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	<-h.answer
	o.Wait = false
	l, err := h.mem.Acquire(context.Background(), key, o)
	if err != nil {
		return nil, err
	}
	h.granted.Add(1)
	return &hangingLease{Lease: l, h: h}, nil
}

func (h *hanging) Ping(context.Context) error { <-h.answer; return nil }

func (h *hanging) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	<-h.answer
	return h.mem.Inspect(ctx, key)
}

func (h *hanging) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	<-h.answer
	return h.mem.List(ctx, prefix, after, limit)
}

func (h *hanging) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	<-h.answer
	return h.mem.ForceRelease(ctx, key, target)
}

type hangingLease struct {
	driver.Lease
	h    *hanging
	hang bool
}

func (l *hangingLease) Release(ctx context.Context) error {
	if l.hang {
		<-l.h.answer
	}
	l.h.released.Add(1)
	return l.Lease.Release(context.Background())
}

// outOfReach is a backend that cannot be reached at all (a closed port):
// every attempt fails at once with ErrUnavailable, and a waiting one keeps
// trying until its context ends, when it returns the context's error, as
// the backends do.
type outOfReach struct{}

func (outOfReach) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	for {
		if !o.Wait {
			return nil, fmt.Errorf("%w: connection refused", driver.ErrUnavailable)
		}
		if err := driver.Sleep(ctx, 100*time.Millisecond, nil); err != nil {
			return nil, err
		}
	}
}

// remote is the memory backend seen through a client that honours its
// context but does not say so (no driver.ContextBounded): guard watches
// its calls as it would a network backend's.
type remote struct{ mem *memory.Locker }

func (r remote) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	return r.mem.Acquire(ctx, key, o)
}

// within runs f and fails t unless it returned within bound and slack of
// fake time.
func within(t *testing.T, what string, bound time.Duration, f func() error) error {
	t.Helper()
	start := time.Now()
	err := f()
	if took := time.Since(start); took > bound+slack {
		t.Errorf("%s took %v, bound %v: more than %v over", what, took, bound, slack)
	}
	return err
}

// Every call against a backend that never answers returns within its bound
// and a small constant, reported as the backend being unavailable; the
// acquisitions left running, answered later, give back what they were
// granted.
func TestBoundsHoldAgainstAHangingBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHanging()
		g := newBubbleGuard(t, h, guard.WithCallTimeout(2*time.Second))
		bg := context.Background()
		deadline := func() context.Context {
			ctx, cancel := context.WithTimeout(bg, time.Second)
			t.Cleanup(cancel)
			return ctx
		}
		unavailable := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, guard.ErrUnavailable) {
				t.Errorf("%s: %v, want ErrUnavailable", what, err)
			}
		}
		timedOut := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, guard.ErrUnavailable) {
				t.Errorf("%s: %v, want ctx's deadline error that matches ErrUnavailable too", what, err)
			}
		}
		unavailable("Lock WaitAtMost(1s)", within(t, "Lock WaitAtMost(1s)", time.Second, func() error {
			_, err := g.Lock(bg, "k", guard.WaitAtMost(time.Second))
			return err
		}))
		unavailable("Lock NoWait", within(t, "Lock NoWait", 2*time.Second, func() error {
			_, err := g.Lock(bg, "k", guard.NoWait())
			return err
		}))
		timedOut("TryLock, ctx 1s", within(t, "TryLock, ctx 1s", time.Second, func() error {
			_, err := g.TryLock(deadline(), "k")
			return err
		}))
		timedOut("Lock, ctx 1s", within(t, "Lock, ctx 1s", time.Second, func() error {
			_, err := g.Lock(deadline(), "k")
			return err
		}))
		timedOut("Do, ctx 1s", within(t, "Do, ctx 1s", time.Second, func() error {
			return g.Do(deadline(), "k", func(context.Context, *guard.Lock) error { return nil })
		}))
		unavailable("DoAll WaitAtMost(1s)", within(t, "DoAll WaitAtMost(1s)", time.Second, func() error {
			return g.DoAll(bg, []string{"a", "b"}, func(context.Context, []*guard.Lock) error { return nil },
				guard.WaitAtMost(time.Second))
		}))
		unavailable("Campaign WaitAtMost(1s)", within(t, "Campaign WaitAtMost(1s)", time.Second, func() error {
			_, err := g.Campaign(bg, "e", guard.WaitAtMost(time.Second))
			return err
		}))
		timedOut("Ping, ctx 1s", within(t, "Ping, ctx 1s", time.Second, func() error { return g.Ping(deadline()) }))
		unavailable("Ping", within(t, "Ping", 2*time.Second, func() error { return g.Ping(bg) }))
		timedOut("Inspect, ctx 1s", within(t, "Inspect, ctx 1s", time.Second, func() error {
			_, err := g.Inspect(deadline(), "k")
			return err
		}))
		timedOut("List, ctx 1s", within(t, "List, ctx 1s", time.Second, func() error {
			_, err := g.List(deadline(), "", "", 10)
			return err
		}))
		timedOut("ForceRelease, ctx 1s", within(t, "ForceRelease, ctx 1s", time.Second, func() error {
			_, err := g.ForceRelease(deadline(), "k", guard.ReleaseTarget{AnyHolder: true})
			return err
		}))

		// The server answers at last: every acquisition left running is
		// granted, and guard gives each lease back.
		close(h.answer)
		synctest.Wait()
		if n, r := h.granted.Load(), h.released.Load(); n == 0 || r != n {
			t.Errorf("%d leases granted after their callers left, %d released: want all released", n, r)
		}
		for _, k := range []string{"k", "a", "b"} {
			if in, _ := h.mem.Inspect(bg, "warden:"+k); len(in.Holders) != 0 {
				t.Errorf("%s left held: %+v", k, in.Holders)
			}
		}
	})
}

// A release that hangs returns within the release timeout, as a failure
// that says the lock may stay taken until its lease expires.
func TestUnlockBoundedByTheReleaseTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHanging()
		close(h.answer)
		g := newBubbleGuard(t, &hangOnRelease{h}, guard.WithReleaseTimeout(time.Second))
		l, err := g.TryLock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		h.answer = make(chan struct{})
		err = within(t, "Unlock", time.Second, func() error { return l.Unlock(context.Background()) })
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Unlock of a hanging release: %v, want ErrUnavailable", err)
		}
		close(h.answer)
		synctest.Wait()
		if h.released.Load() != 1 {
			t.Errorf("the release left running did not complete")
		}
	})
}

// hangOnRelease grants at once, and its leases' releases hang.
type hangOnRelease struct{ h *hanging }

func (x *hangOnRelease) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	l, err := x.h.Acquire(ctx, key, o)
	if err != nil {
		return nil, err
	}
	l.(*hangingLease).hang = true
	return l, nil
}

// A backend that cannot be reached is an outage, not contention: a wait that
// runs out meanwhile is ErrUnavailable, never ErrNotAcquired.
func TestOutageIsNotContention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newBubbleGuard(t, outOfReach{})
		bg := context.Background()
		err := within(t, "Lock WaitAtMost(1s)", time.Second, func() error {
			_, err := g.Lock(bg, "k", guard.WaitAtMost(time.Second))
			return err
		})
		if !errors.Is(err, guard.ErrUnavailable) || errors.Is(err, guard.ErrNotAcquired) {
			t.Errorf("Lock WaitAtMost(1s) of an unreachable backend: %v, want ErrUnavailable", err)
		}
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		err = within(t, "Lock, ctx 1s", time.Second, func() error {
			_, err := g.Lock(ctx, "k")
			return err
		})
		if !errors.Is(err, guard.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Lock, ctx 1s, of an unreachable backend: %v, want ErrUnavailable or the deadline", err)
		}
		if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Lock, ctx 1s, of an unreachable backend: %v does not say the backend was unavailable", err)
		}
	})
}

// A wait for a lock held all along, on a backend that answers, ends on its
// bound with ErrNotAcquired (or the ctx's deadline), not before the bound
// less the last attempt's share, and not after it; a release within that
// share is still caught.
func TestHeldLockWaitsToItsBound(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memory.New()
				var l driver.Locker = mem
				if !direct {
					l = remote{mem}
				}
				g := newBubbleGuard(t, l)
				bg := context.Background()
				held, err := g.TryLock(bg, "k")
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				_, err = g.Lock(bg, "k", guard.WaitAtMost(time.Second))
				took := time.Since(start)
				if !errors.Is(err, guard.ErrNotAcquired) {
					t.Errorf("WaitAtMost(1s) on a held lock: %v, want ErrNotAcquired", err)
				}
				if took < 750*time.Millisecond || took > time.Second+slack {
					t.Errorf("WaitAtMost(1s) on a held lock returned after %v", took)
				}
				ctx, cancel := context.WithTimeout(bg, time.Second)
				defer cancel()
				_, err = g.Lock(ctx, "k")
				if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, guard.ErrUnavailable) {
					t.Errorf("Lock with a 1s deadline on a held lock: %v, want the deadline alone", err)
				}
				// Released in the last attempt's share of the wait: the
				// last attempt takes it.
				time.AfterFunc(960*time.Millisecond, func() { held.Unlock(bg) })
				start = time.Now()
				l2, err := g.Lock(bg, "k", guard.WaitAtMost(time.Second))
				if err != nil {
					t.Fatalf("lock released %v into a 1s wait: %v", 960*time.Millisecond, err)
				}
				if took := time.Since(start); took > time.Second+slack {
					t.Errorf("took %v", took)
				}
				l2.Unlock(bg)
			})
		})
	}
}

// A wait bound of zero or less does not wait: WaitAtMost(time.Until(d)) for
// a deadline d already past makes one attempt.
func TestNonPositiveWaitDoesNotWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newBubbleGuard(t, memory.New())
		bg := context.Background()
		held, err := g.TryLock(bg, "k")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(bg)
		for _, d := range []time.Duration{0, -time.Nanosecond, -time.Hour} {
			done := make(chan error, 1)
			go func() {
				_, err := g.Lock(bg, "k", guard.WaitAtMost(d))
				done <- err
			}()
			synctest.Wait()
			select {
			case err := <-done:
				if !errors.Is(err, guard.ErrNotAcquired) {
					t.Errorf("WaitAtMost(%v) on a held lock: %v, want ErrNotAcquired", d, err)
				}
			default:
				t.Errorf("WaitAtMost(%v) on a held lock is waiting", d)
				held.Unlock(bg)
				<-done
				return
			}
		}
	})
}

// DoAll keeps one wait bound for all its keys, not one per key.
func TestDoAllKeepsOneWaitBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newBubbleGuard(t, memory.New())
		bg := context.Background()
		a, err := g.TryLock(bg, "a")
		if err != nil {
			t.Fatal(err)
		}
		c, err := g.TryLock(bg, "c")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Unlock(bg)
		time.AfterFunc(800*time.Millisecond, func() { a.Unlock(bg) })
		err = within(t, "DoAll WaitAtMost(1s)", time.Second, func() error {
			return g.DoAll(bg, []string{"a", "b", "c"}, func(context.Context, []*guard.Lock) error { return nil },
				guard.WaitAtMost(time.Second))
		})
		if !errors.Is(err, guard.ErrNotAcquired) {
			t.Errorf("DoAll with c held: %v, want ErrNotAcquired", err)
		}
	})
}

// slowToStop is the memory backend behind a client that returns a while
// after its context ends (within guard's grace), as a busy machine makes
// any backend do.
type slowToStop struct{ mem *memory.Locker }

func (s slowToStop) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	l, err := s.mem.Acquire(ctx, key, o)
	if err != nil && ctx.Err() != nil {
		time.Sleep(15 * time.Millisecond)
	}
	return l, err
}

// A backend that answers is never reported unavailable: when a late return
// of the waiting call leaves no time for the last attempt, the wait simply
// ran out, and an attempt's answer past its deadline is still an answer.
func TestLateAnswersAreNotOutages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		g := newBubbleGuard(t, slowToStop{mem})
		bg := context.Background()
		held, err := g.TryLock(bg, "k")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(bg)
		_, err = g.Lock(bg, "k", guard.WaitAtMost(20*time.Millisecond))
		if !errors.Is(err, guard.ErrNotAcquired) || errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("WaitAtMost(20ms) on a held lock, the backend slow to stop: %v, want ErrNotAcquired", err)
		}
		ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
		defer cancel()
		_, err = g.Lock(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("ctx 20ms on a held lock, the backend slow to stop: %v, want the deadline alone", err)
		}
	})
}

// Calls to a backend that guard must be able to stop waiting for run on
// goroutines the Guard keeps, not on one started per call.
func TestCallGoroutinesKept(t *testing.T) {
	const cycles = 100
	g := newGuard(t, remote{memory.New()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := goroutinesStarted()
	for range cycles {
		l, err := g.Lock(ctx, "k", guard.WaitAtMost(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Each cycle makes two such calls (the acquisition under a deadline,
	// and the release); other goroutines of the process may start
	// meanwhile, but not one per call.
	if started := goroutinesStarted() - before; started >= cycles/2 {
		t.Errorf("%d goroutines started by %d lock cycles", started, cycles)
	}
}

// A call goroutine whose caller stopped waiting answers nobody when its
// call returns at last, gives back what it was granted, and serves the
// calls after it with their own answers.
func TestAbandonedCallerServesLaterCalls(t *testing.T) {
	h := newHanging()
	g := newGuard(t, h, guard.WithIdleCallers(1))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := g.TryLock(ctx, "k"); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("TryLock on a hanging backend: %v, want ErrUnavailable", err)
	}
	close(h.answer)
	waitFor(t, "the late grant given back", 10*time.Second, func() bool { return h.released.Load() == 1 })
	for i := range 20 {
		l, err := g.TryLock(context.Background(), "k")
		if err != nil {
			t.Fatalf("TryLock %d after the abandoned call: %v", i, err)
		}
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock %d: %v", i, err)
		}
	}
	if n := h.granted.Load(); n != 21 {
		t.Errorf("%d grants, want 21 (the late one and 20 after)", n)
	}
	if n := h.released.Load(); n != 21 {
		t.Errorf("%d releases, want 21", n)
	}
}

// Many sections at once through the kept call goroutines, more than stay
// idle: each call gets its own answer (a lease, never another call's or
// none), and the sections on one key never overlap.
func TestCallGoroutinesShared(t *testing.T) {
	g := newGuard(t, remote{memory.New()}, guard.WithIdleCallers(4))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var inside, overlaps atomic.Int32
	for w := range 32 {
		wg.Go(func() {
			for i := range 100 {
				key := fmt.Sprintf("k%d", (w+i)%3)
				err := g.Do(ctx, key, func(context.Context, *guard.Lock) error {
					if key == "k0" {
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						inside.Add(-1)
					}
					return nil
				}, guard.WaitAtMost(30*time.Second))
				if err != nil {
					t.Errorf("Do %s: %v", key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d sections on k0 overlapped", n)
	}
}

// The call goroutines a Guard keeps idle end within a second (handoff.maxIdleFor)
// of their last call, and not before half of it; one used again meanwhile
// stays, and serves.
func TestIdleCallersEnd(t *testing.T) {
	// Those of earlier tests' Guards, outside the bubble, end first.
	waitFor(t, "the call goroutines of earlier tests ended", 10*time.Second, func() bool { return callGoroutines(t) == 0 })
	synctest.Test(t, func(t *testing.T) {
		g, err := guard.New(remote{memory.New()}, guard.WithIdleCallers(4))
		if err != nil {
			t.Fatal(err)
		}
		cycle := func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			l, err := g.Lock(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		idle := func(after string, want int) {
			t.Helper()
			synctest.Wait()
			if n := callGoroutines(t); n != want {
				t.Errorf("%s: %d call goroutines, want %d", after, n, want)
			}
		}
		for i := range 4 {
			cycle()
			idle(fmt.Sprintf("after cycle %d", i), 1)
			time.Sleep(490 * time.Millisecond)
			idle(fmt.Sprintf("490ms after cycle %d", i), 1)
		}
		time.Sleep(time.Second - 490*time.Millisecond)
		idle("a second after the last cycle", 0)
	})
}

// callGoroutines counts the process's call goroutines, idle or not.
func callGoroutines(t *testing.T) int {
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		t.Fatal(err)
	}
	return strings.Count(b.String(), "handoff.(*caller).run(")
}

// refusedThenSilent is a backend whose waiting attempts fail with refusal
// until their context ends, and report it then (driver.Unreached), and
// whose single attempts get no answer: a client that dials again after a
// refused connection for longer than guard's last attempt has (go-redis
// with its default options).
type refusedThenSilent struct{ refusal error }

func (b refusedThenSilent) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	if !o.Wait {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	for {
		if err := driver.Sleep(ctx, 100*time.Millisecond, nil); err != nil {
			return nil, driver.Unreached(ctx, b.refusal)
		}
	}
}

// A bounded wait whose attempts failed, and whose last attempt got no
// answer, says what the attempts failed with, not only that no answer
// came: that is what the caller can mend (an address nothing listens on).
func TestWaitSaysWhyItWasUnanswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refusal := fmt.Errorf("%w: dial tcp 127.0.0.1:6379: connect: connection refused", driver.ErrUnavailable)
		g := newBubbleGuard(t, refusedThenSilent{refusal: refusal})
		err := within(t, "Lock WaitAtMost(1s)", time.Second, func() error {
			_, err := g.Lock(context.Background(), "k", guard.WaitAtMost(time.Second))
			return err
		})
		if !errors.Is(err, guard.ErrUnavailable) || !errors.Is(err, refusal) || errors.Is(err, guard.ErrNotAcquired) {
			t.Fatalf("Lock WaitAtMost(1s): %v, want ErrUnavailable carrying the attempts' failure", err)
		}
		const want = `warden: lock "k": backend unavailable: no answer within the bound; before it, dial tcp 127.0.0.1:6379: connect: connection refused`
		if err.Error() != want {
			t.Errorf("Lock WaitAtMost(1s): %q, want %q", err, want)
		}
	})
}

// earlyDeadline is a backend whose client counts its context's deadline
// itself, as gRPC does under etcd's client: a single attempt that gets no
// answer returns context.DeadlineExceeded a moment before the context's
// own timer marks it done.
type earlyDeadline struct{}

func (earlyDeadline) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	d, ok := ctx.Deadline()
	if !ok {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	time.Sleep(time.Until(d) - time.Microsecond)
	return nil, context.DeadlineExceeded
}

// A single attempt that a client cut short at its own reckoning of the
// bound is an outage (ErrUnavailable), as one cut by guard's context is,
// never a bare deadline the caller did not set.
func TestClientCountedDeadlineIsNoAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newBubbleGuard(t, earlyDeadline{})
		err := within(t, "TryLock", 5*time.Second, func() error {
			_, err := g.TryLock(context.Background(), "k")
			return err
		})
		if !errors.Is(err, guard.ErrUnavailable) || errors.Is(err, guard.ErrNotAcquired) {
			t.Errorf("TryLock cut short by the client's own count of the call timeout: %v, want ErrUnavailable", err)
		}
	})
}

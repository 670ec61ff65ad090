package guard_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
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

// faulty wraps the real memory backend so a test can make its leases fail
// to refresh, block in refresh, lie about their expiry, or its acquisitions
// fail: the faults a remote backend has, which guard must turn into
// cancelled contexts and sentinel errors.
//
// It renews one lease per request: it does not pass on the memory backend's
// batch refresh.
type faulty struct {
	mem           *memory.Locker
	refreshErr    atomic.Pointer[error]
	acquireErr    atomic.Pointer[error]
	refreshBlock  atomic.Bool // refreshes hang, ignoring their ctx, until the test ends
	fakeRenew     atomic.Bool // refreshes answer success without renewing, and Expiry lies
	renewThenHang atomic.Bool // refreshes renew, then hang before answering, ignoring their ctx
	refreshes     atomic.Int32
	unblock       chan struct{}
}

func newFaulty(t testing.TB) *faulty {
	f := &faulty{mem: memory.New(), unblock: make(chan struct{})}
	t.Cleanup(func() { close(f.unblock) })
	return f
}

func (f *faulty) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	if err := f.acquireErr.Load(); err != nil {
		return nil, *err
	}
	l, err := f.mem.Acquire(ctx, key, o)
	if err != nil {
		return nil, err
	}
	return &faultyLease{Lease: l, f: f}, nil
}

type faultyLease struct {
	driver.Lease
	f *faulty
}

func (l *faultyLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.f.refreshes.Add(1)
	if l.f.refreshBlock.Load() {
		<-l.f.unblock // a client that ignores ctx deadlines
		return context.DeadlineExceeded
	}
	if l.f.renewThenHang.Load() {
		err := l.Lease.Refresh(ctx, ttl)
		<-l.f.unblock // the answer is slow to reach the keeper
		return err
	}
	if err := l.f.refreshErr.Load(); err != nil {
		return *err
	}
	if l.f.fakeRenew.Load() {
		return nil
	}
	return l.Lease.Refresh(ctx, ttl)
}

func (l *faultyLease) Expiry() time.Time {
	if l.f.fakeRenew.Load() {
		return time.Now().Add(time.Hour)
	}
	return l.Lease.Expiry()
}

func newGuard(t testing.TB, l driver.Locker, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g, err := guard.New(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// newBubbleGuard is newGuard for a testing/synctest bubble: the Guard
// keeps no idle goroutine that would outlive the bubble's test.
func newBubbleGuard(t testing.TB, l driver.Locker, opts ...guard.Option) *guard.Guard {
	t.Helper()
	return newGuard(t, l, append(opts, guard.WithIdleCallers(0))...)
}

func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", limit, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestDoExcludesAndReleases(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, memory.New())
	ran := false
	err := g.Do(ctx, "orders/close", func(ctx context.Context, l *guard.Lock) error {
		ran = true
		if l.Token() == 0 {
			t.Error("token is 0")
		}
		if l.Key() != "orders/close" {
			t.Errorf("Key() = %q", l.Key())
		}
		// Another caller (a context not carrying the lock) is excluded.
		if _, err := g.TryLock(context.Background(), "orders/close"); !errors.Is(err, guard.ErrNotAcquired) {
			t.Errorf("TryLock while held: %v, want ErrNotAcquired", err)
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do: ran=%v err=%v", ran, err)
	}
	l, err := g.TryLock(ctx, "orders/close")
	if err != nil {
		t.Fatalf("TryLock after Do: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Errorf("second Unlock: %v, want nil", err)
	}
	if !errors.Is(l.Err(), guard.ErrNotHeld) {
		t.Errorf("Err after Unlock: %v, want ErrNotHeld", l.Err())
	}
	if l.Context().Err() == nil {
		t.Error("lock context not cancelled after Unlock")
	}
}

func TestDoReturnsSectionError(t *testing.T) {
	g := newGuard(t, memory.New())
	want := errors.New("boom")
	if err := g.Do(context.Background(), "k", func(context.Context, *guard.Lock) error { return want }); !errors.Is(err, want) {
		t.Fatalf("Do: %v, want %v", err, want)
	}
	if _, err := g.TryLock(context.Background(), "k"); err != nil {
		t.Fatalf("lock not released after a failed section: %v", err)
	}
}

func TestWatchdogKeepsLeaseAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFaulty(t)
		ttl := 150 * time.Millisecond
		g := newBubbleGuard(t, f, guard.WithTTL(ttl))
		err := g.Do(context.Background(), "long", func(ctx context.Context, l *guard.Lock) error {
			// Hold for several TTLs: only refreshes keep others out.
			waitFor(t, "five refreshes", 10*time.Second, func() bool { return f.refreshes.Load() >= 5 })
			if _, err := g.TryLock(context.Background(), "long"); !errors.Is(err, guard.ErrNotAcquired) {
				t.Errorf("TryLock after %d refreshes: %v, want ErrNotAcquired", f.refreshes.Load(), err)
			}
			return ctx.Err()
		})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
	})
}

func TestRefreshNotHeldCancelsSection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFaulty(t)
		notHeld := error(guard.ErrNotHeld)
		f.refreshErr.Store(&notHeld)
		ttl := 600 * time.Millisecond
		g := newBubbleGuard(t, f, guard.WithTTL(ttl))
		start := time.Now()
		var cancelledAfter time.Duration
		err := g.Do(context.Background(), "k", func(ctx context.Context, l *guard.Lock) error {
			select {
			case <-ctx.Done():
				cancelledAfter = time.Since(start)
			case <-time.After(10 * time.Second):
				t.Fatal("section context not cancelled after the refresh failed")
			}
			if cause := context.Cause(ctx); !errors.Is(cause, guard.ErrLockLost) {
				t.Errorf("cause %v, want ErrLockLost", cause)
			}
			if !errors.Is(l.Err(), guard.ErrLockLost) {
				t.Errorf("l.Err() = %v, want ErrLockLost", l.Err())
			}
			return nil
		})
		if !errors.Is(err, guard.ErrLockLost) || !errors.Is(err, guard.ErrNotHeld) {
			t.Errorf("Do after loss: %v, want ErrLockLost and ErrNotHeld", err)
		}
		// The first refresh is due at ttl/3; the loss must be acted on then, and
		// certainly before the lease could have expired on the server.
		t.Logf("cancelled %v after acquiring (refresh due at %v, ttl %v)", cancelledAfter, ttl/3, ttl)
		if cancelledAfter >= ttl {
			t.Errorf("cancelled after %v: not before the lease's ttl %v", cancelledAfter, ttl)
		}
	})
}

func TestTransientRefreshFailuresLoseBeforeExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFaulty(t)
		down := fmt.Errorf("%w: connection refused", guard.ErrUnavailable)
		f.refreshErr.Store(&down)
		ttl := 600 * time.Millisecond
		g := newBubbleGuard(t, f, guard.WithTTL(ttl))
		start := time.Now()
		err := g.Do(context.Background(), "k", func(ctx context.Context, l *guard.Lock) error {
			<-ctx.Done()
			if d := time.Since(start); d > ttl {
				t.Errorf("section cancelled %v after acquiring: after the lease's ttl %v, when another owner may hold it", d, ttl)
			}
			return ctx.Err()
		})
		if !errors.Is(err, guard.ErrLockLost) {
			t.Fatalf("Do: %v, want ErrLockLost", err)
		}
		if n := f.refreshes.Load(); n < 2 {
			t.Errorf("%d refresh attempts, want retries before giving up", n)
		}
	})
}

func TestReentrancy(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, memory.New())
	outer, err := g.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := g.TryLock(outer.Context(), "k")
	if err != nil {
		t.Fatalf("nested TryLock with the holder's context: %v", err)
	}
	if inner != outer {
		t.Error("nested lock is not the held lock")
	}
	// A nested Do through a context derived from the holder's.
	derived, cancel := context.WithCancel(outer.Context())
	defer cancel()
	if err := g.Do(derived, "k", func(context.Context, *guard.Lock) error { return nil }); err != nil {
		t.Fatalf("nested Do: %v", err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// One hold remains: still excluded for others.
	if _, err := g.TryLock(ctx, "k"); !errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("TryLock after the inner unlock: %v, want ErrNotAcquired", err)
	}
	if outer.Err() != nil {
		t.Fatalf("outer lock: %v", outer.Err())
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := g.TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("TryLock after the outermost unlock: %v", err)
	}
	l.Unlock(ctx)

	// Another Guard's lock on the same key is not reentrant.
	g2 := newGuard(t, memory.New())
	held, _ := g.Lock(ctx, "k")
	defer held.Unlock(ctx)
	other, err := g2.TryLock(held.Context(), "k")
	if err != nil {
		t.Fatalf("a different Guard (backend): %v", err)
	}
	if other == held {
		t.Error("a different Guard reentered the lock")
	}
	other.Unlock(ctx)
}

func TestReentrancyModes(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, memory.New())
	w, err := g.Lock(ctx, "doc", guard.Write())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Unlock(ctx)
	r, err := g.TryLock(w.Context(), "doc", guard.Read())
	if err != nil || r != w {
		t.Fatalf("read inside write: %v (same lock: %v)", err, r == w)
	}
	r.Unlock(ctx)

	rl, err := g.Lock(ctx, "page", guard.Read())
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Unlock(ctx)
	if _, err := g.Lock(rl.Context(), "page", guard.Write()); !errors.Is(err, guard.ErrInvalidOption) {
		t.Fatalf("write inside read (an upgrade that would deadlock): %v, want ErrInvalidOption", err)
	}
}

func TestDoAllTakesAllOrNothingWithoutDeadlock(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, memory.New())
	var inside atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	// Opposite orders: taken as given, these would deadlock.
	for _, keys := range [][]string{{"a", "b", "c"}, {"c", "b", "a"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				err := g.DoAll(ctx, keys, func(ctx context.Context, locks []*guard.Lock) error {
					if n := inside.Add(1); n != 1 {
						return fmt.Errorf("%d callers inside", n)
					}
					if len(locks) != 3 || locks[0].Key() != "a" || locks[2].Key() != "c" {
						return fmt.Errorf("locks not in key order: %d", len(locks))
					}
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("DoAll deadlocked")
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// All or nothing: with "b" held elsewhere, none of the keys stay taken.
	b, _ := g.Lock(ctx, "b")
	err := g.DoAll(ctx, []string{"a", "b", "c"}, func(context.Context, []*guard.Lock) error {
		t.Error("section ran without all its locks")
		return nil
	}, guard.NoWait())
	if !errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("DoAll with a held key: %v, want ErrNotAcquired", err)
	}
	b.Unlock(ctx)
	a, err := g.TryLock(ctx, "a")
	if err != nil {
		t.Fatalf("key a left locked by a failed DoAll: %v", err)
	}
	a.Unlock(ctx)
	if err := g.DoAll(ctx, nil, func(context.Context, []*guard.Lock) error { return nil }); !errors.Is(err, guard.ErrInvalidKey) {
		t.Errorf("DoAll with no keys: %v, want ErrInvalidKey", err)
	}
}

// A key DoAll cannot take is reported before any is taken: not after
// waiting, perhaps for ever, for the valid keys sorted before it.
func TestDoAllChecksEveryKeyFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		mem := memory.New()
		g := newBubbleGuard(t, mem)
		held, err := newBubbleGuard(t, mem).Lock(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(ctx)
		wctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		start := time.Now()
		err = g.DoAll(wctx, []string{"a", "b\x00"}, func(context.Context, []*guard.Lock) error { return nil })
		if !errors.Is(err, guard.ErrInvalidKey) || time.Since(start) > 0 {
			t.Errorf("DoAll with an invalid key after a held one: %v after %v, want ErrInvalidKey at once", err, time.Since(start))
		}
		if n := mem.Waiters("warden:a"); n != 0 {
			t.Errorf("%d waiters left on a", n)
		}
	})
}

func TestErrorSentinels(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, memory.New())
	noop := func(context.Context, *guard.Lock) error { return nil }

	for _, key := range []string{"", strings.Repeat("k", guard.MaxKeyLen+1), "a\x00b", "line\nbreak", "bad\xffutf8"} {
		if err := g.Do(ctx, key, noop); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("Do(%q): %v, want ErrInvalidKey", key, err)
		}
	}
	if err := g.Do(ctx, "k", noop, guard.TTL(0)); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("TTL(0): %v, want ErrInvalidOption", err)
	}
	if err := g.Do(ctx, "k", noop, guard.Permits(0)); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("Permits(0): %v, want ErrInvalidOption", err)
	}
	for _, opt := range []guard.Option{guard.WithTTL(-time.Second), guard.WithReleaseTimeout(0), guard.WithCallTimeout(0), guard.WithPrefix("a\tb")} {
		if _, err := guard.New(memory.New(), opt); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("New with a bad option: %v, want ErrInvalidOption", err)
		}
	}
	if _, err := guard.New(nil); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("New(nil): %v, want ErrInvalidOption", err)
	}

	// Capabilities the backend lacks.
	plain := newGuard(t, struct{ driver.Locker }{memory.New()})
	if err := plain.Do(ctx, "k", noop, guard.Read()); !errors.Is(err, guard.ErrUnsupported) {
		t.Errorf("Read on a backend without RWLocker: %v, want ErrUnsupported", err)
	}
	if err := plain.Do(ctx, "k", noop, guard.Permits(2)); !errors.Is(err, guard.ErrUnsupported) {
		t.Errorf("Permits on a backend without Semaphorer: %v, want ErrUnsupported", err)
	}

	// Held elsewhere: not acquired, at once or after the wait bound.
	held, _ := g.Lock(ctx, "busy")
	if err := g.Do(ctx, "busy", noop, guard.NoWait()); !errors.Is(err, guard.ErrNotAcquired) {
		t.Errorf("NoWait on a held lock: %v, want ErrNotAcquired", err)
	}
	if err := g.Do(ctx, "busy", noop, guard.WaitAtMost(20*time.Millisecond)); !errors.Is(err, guard.ErrNotAcquired) {
		t.Errorf("WaitAtMost on a held lock: %v, want ErrNotAcquired", err)
	}
	// Context errors stay context errors.
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if err := g.Do(cctx, "busy", noop); !errors.Is(err, context.Canceled) || errors.Is(err, guard.ErrNotAcquired) {
		t.Errorf("cancelled while waiting: %v, want context.Canceled only", err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer dcancel()
	if err := g.Do(dctx, "busy", noop); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline while waiting: %v, want context.DeadlineExceeded", err)
	}
	held.Unlock(ctx)

	// The backend is down.
	f := newFaulty(t)
	down := fmt.Errorf("%w: dial tcp: connection refused", guard.ErrUnavailable)
	f.acquireErr.Store(&down)
	if err := newGuard(t, f).Do(ctx, "k", noop); !errors.Is(err, guard.ErrUnavailable) {
		t.Errorf("backend down: %v, want ErrUnavailable", err)
	}

	// Unlock after the lease was lost reports not held.
	f = newFaulty(t)
	notHeld := error(guard.ErrNotHeld)
	f.refreshErr.Store(&notHeld)
	lost, err := newGuard(t, f, guard.WithTTL(60*time.Millisecond)).Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	<-lost.Context().Done()
	if err := lost.Unlock(ctx); !errors.Is(err, guard.ErrNotHeld) || !errors.Is(err, guard.ErrLockLost) {
		t.Errorf("Unlock of a lost lock: %v, want ErrNotHeld and ErrLockLost", err)
	}
}

func TestPanicInSectionReleasesAndPropagates(t *testing.T) {
	g := newGuard(t, memory.New())
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want the section's panic", r)
			}
		}()
		g.Do(context.Background(), "k", func(context.Context, *guard.Lock) error { panic("boom") })
	}()
	l, err := g.TryLock(context.Background(), "k")
	if err != nil {
		t.Fatalf("lock not released after a panic: %v", err)
	}
	l.Unlock(context.Background())
}

// An Unlock that panics (a faulty driver's Release) in DoAll, whether the
// section returned or panicked first, leaves the other locks released, not
// held and renewed for the life of the process; the panic goes on up.
func TestPanickingUnlockReleasesTheOthers(t *testing.T) {
	sections := map[string]func(context.Context, []*guard.Lock) error{
		"returned": func(context.Context, []*guard.Lock) error { return nil },
		"panicked": func(context.Context, []*guard.Lock) error { panic("section") },
	}
	for name, fn := range sections {
		mem := memory.New()
		var fired atomic.Bool
		b := &onRelease{mem: mem, release: func(context.Context) {
			if fired.CompareAndSwap(false, true) {
				panic("release") // the first release: the innermost lock's, "b"
			}
		}}
		g := newGuard(t, b)
		var got any
		func() {
			defer func() { got = recover() }()
			g.DoAll(context.Background(), []string{"a", "b"}, fn)
		}()
		if got == nil {
			t.Errorf("%s: the panic did not go on up", name)
		}
		if held := g.Held(); len(held) != 0 {
			t.Errorf("%s: %d locks still held after an Unlock panicked: %+v", name, len(held), held)
		}
		if l, err := newGuard(t, mem).TryLock(context.Background(), "a"); err != nil {
			t.Errorf("%s: a not released: %v", name, err)
		} else {
			l.Unlock(context.Background())
		}
	}
}

// A section that leaves by runtime.Goexit (t.FailNow inside Do, a
// library calling it) unwinds without a panic to recover: its locks are
// released all the same.
func TestGoexitInSectionReleases(t *testing.T) {
	g := newGuard(t, memory.New())
	sections := map[string]func(){
		"Do": func() {
			g.Do(context.Background(), "k", func(context.Context, *guard.Lock) error {
				runtime.Goexit()
				return nil
			})
		},
		"DoAll": func() {
			g.DoAll(context.Background(), []string{"a", "b"}, func(context.Context, []*guard.Lock) error {
				runtime.Goexit()
				return nil
			})
		},
	}
	for name, section := range sections {
		done := make(chan struct{})
		go func() {
			defer close(done)
			section()
		}()
		<-done
		if held := g.Held(); len(held) != 0 {
			t.Errorf("%s: %d locks still held after the section called runtime.Goexit: %+v", name, len(held), held)
		}
	}
	for _, k := range []string{"k", "a", "b"} {
		l, err := g.TryLock(context.Background(), k)
		if err != nil {
			t.Fatalf("%s not released: %v", k, err)
		}
		l.Unlock(context.Background())
	}
}

// A safety margin must be shorter than half of every TTL, however large it
// is: doubling one past half the largest Duration must not wrap it round
// into a small one that every TTL passes.
func TestSafetyMarginPastHalfTheLargestDuration(t *testing.T) {
	for _, margin := range []time.Duration{math.MaxInt64, math.MaxInt64/2 + 1} {
		if _, err := guard.New(memory.New(), guard.WithSafetyMargin(margin)); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("WithSafetyMargin(%v) with a TTL of 30s: %v, want ErrInvalidOption", margin, err)
		}
	}
	g := newGuard(t, memory.New(), guard.WithTTL(time.Minute), guard.WithSafetyMargin(29*time.Second))
	if err := g.ValidateTTL(58 * time.Second); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("ValidateTTL(58s) with a margin of 29s: %v, want ErrInvalidOption", err)
	}
	if err := g.ValidateTTL(58*time.Second + 1); err != nil {
		t.Errorf("ValidateTTL(58s+1ns) with a margin of 29s: %v", err)
	}
}

func TestUnlockWithCancelledContextStillReleases(t *testing.T) {
	g := newGuard(t, memory.New())
	ctx, cancel := context.WithCancel(context.Background())
	l, err := g.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock with a cancelled context: %v", err)
	}
	again, err := g.TryLock(context.Background(), "k")
	if err != nil {
		t.Fatalf("lock not released: %v", err)
	}
	again.Unlock(context.Background())
}

func TestPrefixNamespacesKeys(t *testing.T) {
	ctx := context.Background()
	shared := memory.New()
	a := newGuard(t, shared, guard.WithPrefix("svc-a:"))
	b := newGuard(t, shared, guard.WithPrefix("svc-b:"))
	la, err := a.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer la.Unlock(ctx)
	lb, err := b.TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("same key under another prefix: %v", err)
	}
	lb.Unlock(ctx)
	if _, err := newGuard(t, shared, guard.WithPrefix("svc-a:")).TryLock(ctx, "job"); !errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("same prefix and key: %v, want ErrNotAcquired", err)
	}
}

func TestSemaphoreAndReadWriteThroughGuard(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, memory.New())
	var held []*guard.Lock
	for range 2 {
		l, err := g.TryLock(ctx, "pool", guard.Permits(2))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	if _, err := g.TryLock(ctx, "pool", guard.Permits(2)); !errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("third permit of two: %v", err)
	}
	for _, l := range held {
		l.Unlock(ctx)
	}
	r1, err := g.TryLock(ctx, "doc", guard.Read())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := g.TryLock(ctx, "doc", guard.Read())
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if _, err := g.TryLock(ctx, "doc", guard.Write()); !errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("writer while reading: %v", err)
	}
	r1.Unlock(ctx)
	r2.Unlock(ctx)
}

func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"", "a", "orders/close", "user:42", "\x00", "é", strings.Repeat("x", 201), "a\u0085b", "\xff"} {
		f.Add(s)
	}
	g, err := guard.New(memory.New())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key string) {
		verr := guard.ValidateKey(key)
		if verr != nil && !errors.Is(verr, guard.ErrInvalidKey) {
			t.Fatalf("ValidateKey(%q) = %v: not ErrInvalidKey", key, verr)
		}
		if verr == nil && (key == "" || len(key) > guard.MaxKeyLen || strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f })) {
			t.Fatalf("ValidateKey(%q) accepted a bad key", key)
		}
		// Whatever the key, TryLock answers with an error or a lock, never a panic.
		l, err := g.TryLock(context.Background(), key)
		if (err == nil) != (verr == nil) {
			t.Fatalf("TryLock(%q) = %v, ValidateKey = %v", key, err, verr)
		}
		if l != nil {
			l.Unlock(context.Background())
		}
	})
}

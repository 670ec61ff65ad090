package guard_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
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

// A renewal that hangs, in a client that ignores ctx deadlines, must not
// delay the loss: the section's ctx is cancelled by the lease's conservative
// expiry minus the margin, never after the expiry.
func TestHungRefreshLosesOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for range 3 {
			f := newFaulty(t)
			f.refreshBlock.Store(true)
			ttl, margin := 900*time.Millisecond, 250*time.Millisecond
			g := newBubbleGuard(t, f, guard.WithTTL(ttl), guard.WithSafetyMargin(margin))
			var expiry, cancelled time.Time
			err := g.Do(context.Background(), "hung", func(ctx context.Context, l *guard.Lock) error {
				expiry = l.Expiry()
				select {
				case <-ctx.Done():
					cancelled = time.Now()
				case <-time.After(10 * ttl):
					t.Fatal("section context not cancelled while the renewal hung")
				}
				return nil
			})
			if !errors.Is(err, guard.ErrLockLost) {
				t.Fatalf("Do: %v, want ErrLockLost", err)
			}
			if !cancelled.Before(expiry) {
				t.Errorf("cancelled %v after the lease's conservative expiry", cancelled.Sub(expiry))
			}
			if early := expiry.Sub(cancelled); early > margin+50*time.Millisecond+ttl/3 {
				t.Errorf("cancelled %v before the expiry: far earlier than the margin %v", early, margin)
			}
			if !strings.Contains(err.Error(), `warden: lock "hung" lost: `) {
				t.Errorf("error text %q does not name the lock once", err)
			}
		}
	})
}

// A section whose lease was taken over, where nothing told guard before the
// release (renewals answered yes, but the lease ran out on the server), must
// make Do report the loss, every time.
func TestTakeoverFoundAtReleaseIsALoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFaulty(t)
		f.fakeRenew.Store(true)
		ttl := 60 * time.Millisecond
		g := newBubbleGuard(t, f, guard.WithTTL(ttl))
		other := newBubbleGuard(t, f.mem)
		for i := range 20 {
			key := "taken/" + strconv.Itoa(i)
			err := g.Do(context.Background(), key, func(ctx context.Context, l *guard.Lock) error {
				// The memory lease expires on its own; another owner takes it.
				taken, err := other.Lock(context.Background(), key, guard.WaitAtMost(10*time.Second))
				if err != nil {
					return err
				}
				return taken.Unlock(context.Background())
			})
			if !errors.Is(err, guard.ErrLockLost) || !errors.Is(err, guard.ErrNotHeld) {
				t.Fatalf("round %d: Do = %v, want ErrLockLost and ErrNotHeld", i, err)
			}
		}
	})
}

// sessionLocker wraps the memory backend so that its leases are kept alive
// by a session, as etcd's and ZooKeeper's are: guard must never refresh
// them, and must lose them all when the session goes.
type sessionLocker struct {
	*memory.Locker
	sess       *fakeSession
	refreshes  atomic.Int32
	releaseErr atomic.Pointer[error] // releases fail with it, once set
}

type fakeSession struct {
	mu     sync.Mutex
	expiry time.Time
	done   chan struct{}
}

func (s *fakeSession) Expiry() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expiry
}

func (s *fakeSession) Done() <-chan struct{} { return s.done }

func (s *fakeSession) renew(ttl time.Duration) {
	s.mu.Lock()
	s.expiry = time.Now().Add(ttl)
	s.mu.Unlock()
}

type sessionLease struct {
	driver.Lease
	l *sessionLocker
}

func (l *sessionLease) Session() driver.Session { return l.l.sess }
func (l *sessionLease) Expiry() time.Time       { return l.l.sess.Expiry() }
func (l *sessionLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.l.refreshes.Add(1)
	return l.Lease.Refresh(ctx, ttl)
}

func (l *sessionLease) Release(ctx context.Context) error {
	if err := l.l.releaseErr.Load(); err != nil {
		return *err
	}
	return l.Lease.Release(ctx)
}

func newSessionLocker(ttl time.Duration) *sessionLocker {
	s := &sessionLocker{Locker: memory.New(), sess: &fakeSession{done: make(chan struct{})}}
	s.sess.renew(ttl)
	return s
}

func (s *sessionLocker) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	// The in-process lease itself must outlive the test: the session, not
	// the memory TTL, is what this backend's leases live by.
	o.TTL = time.Hour
	l, err := s.Locker.Acquire(ctx, key, o)
	if err != nil {
		return nil, err
	}
	return &sessionLease{Lease: l, l: s}, nil
}

func TestSessionLossCancelsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sl := newSessionLocker(time.Hour)
		g := newBubbleGuard(t, sl, guard.WithTTL(3*time.Second))
		ctx := context.Background()
		a, err := g.Lock(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		b, err := g.Lock(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		close(sl.sess.done)
		for _, l := range []*guard.Lock{a, b} {
			select {
			case <-l.Context().Done():
			case <-time.After(5 * time.Second):
				t.Fatal("a lock of a lost session was not cancelled")
			}
			if err := l.Unlock(ctx); !errors.Is(err, guard.ErrLockLost) {
				t.Errorf("Unlock after the session was lost: %v, want ErrLockLost", err)
			}
		}
		if n := sl.refreshes.Load(); n != 0 {
			t.Errorf("%d per-lock refreshes of session leases, want none", n)
		}
	})
}

// The keeper keeps a session's locks in a slice, each at its index: locks
// unlocked in any order leave the others watched, listed by Held, and lost
// with the session, and only them.
func TestSessionLocksUnlockedInAnyOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sl := newSessionLocker(time.Hour)
		g := newBubbleGuard(t, sl, guard.WithTTL(3*time.Second))
		ctx := context.Background()
		locks := map[string]*guard.Lock{}
		for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
			l, err := g.Lock(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			locks[k] = l
		}
		// The first, a middle one, the last, and a middle one again.
		for _, k := range []string{"a", "d", "f", "c"} {
			if err := locks[k].Unlock(ctx); err != nil {
				t.Fatalf("Unlock %s: %v", k, err)
			}
		}
		var held []string
		for _, h := range g.Held() {
			if !h.SessionBound {
				t.Errorf("%s not listed as session-bound", h.Key)
			}
			held = append(held, h.Key)
		}
		if !slices.Equal(held, []string{"b", "e"}) {
			t.Fatalf("Held lists %v, want [b e]", held)
		}
		close(sl.sess.done)
		for _, k := range []string{"b", "e"} {
			select {
			case <-locks[k].Context().Done():
			case <-time.After(5 * time.Second):
				t.Fatalf("%s, held when its session was lost, was not cancelled", k)
			}
			if err := locks[k].Unlock(ctx); !errors.Is(err, guard.ErrLockLost) {
				t.Errorf("Unlock %s after the session was lost: %v, want ErrLockLost", k, err)
			}
		}
		for k, l := range locks {
			if e := l.Expiry(); !e.IsZero() {
				t.Errorf("%s, off its session: Expiry %v, want none (the zero time)", k, e)
			}
		}
		for _, k := range []string{"a", "c", "d", "f"} {
			if err := locks[k].Err(); !errors.Is(err, guard.ErrNotHeld) || errors.Is(err, guard.ErrLockLost) {
				t.Errorf("%s, unlocked before the session was lost: Err %v, want ErrNotHeld and no loss", k, err)
			}
		}
		if held := g.Held(); len(held) != 0 {
			t.Errorf("Held lists %v after every lock was unlocked", held)
		}
	})
}

func TestSessionNotRenewedLosesOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ttl := 900 * time.Millisecond
		sl := newSessionLocker(ttl)
		g := newBubbleGuard(t, sl, guard.WithTTL(ttl))
		ctx := context.Background()
		// Renew the session for a while: the lock must stay.
		l, err := g.Lock(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		for range 6 {
			time.Sleep(ttl / 3)
			sl.sess.renew(ttl)
			if l.Err() != nil {
				t.Fatalf("lock lost while its session was renewed: %v", l.Err())
			}
		}
		expiry := sl.sess.Expiry()
		select {
		case <-l.Context().Done():
		case <-time.After(10 * ttl):
			t.Fatal("lock kept after its session stopped being renewed")
		}
		if now := time.Now(); !now.Before(expiry) {
			t.Errorf("cancelled %v after the session's expiry", now.Sub(expiry))
		}
		l.Unlock(ctx)
		if n := sl.refreshes.Load(); n != 0 {
			t.Errorf("%d per-lock refreshes of session leases, want none", n)
		}
		// The session ends, and with it the keeper's watch of it.
		close(sl.sess.done)
	})
}

// Holding many locks costs no goroutine per lock, whether they are renewed
// one by one or kept by a session.
func TestGoroutinesDoNotGrowWithHeldLocks(t *testing.T) {
	const n = 10000
	for _, tc := range []struct {
		name   string
		locker driver.Locker
	}{
		{"memory", memory.New()},
		{"session", newSessionLocker(time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuard(t, tc.locker, guard.WithTTL(3*time.Second))
			ctx := context.Background()
			before := runtime.NumGoroutine()
			locks := make([]*guard.Lock, 0, n)
			for i := range n {
				l, err := g.Lock(ctx, "many/"+strconv.Itoa(i))
				if err != nil {
					t.Fatal(err)
				}
				locks = append(locks, l)
			}
			// Across a renewal, so the keeper's work is counted too.
			time.Sleep(1200 * time.Millisecond)
			during := runtime.NumGoroutine()
			for _, l := range locks {
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if during-before > 5 {
				t.Errorf("%d goroutines with %d held locks, %d with none", during, n, before)
			}
		})
	}
}

// batchCounter is the memory backend with a batch refresh that counts its
// calls.
type batchCounter struct {
	*memory.Locker
	batches atomic.Int32
	leases  atomic.Int32
}

func (b *batchCounter) RefreshBatch(ctx context.Context, leases []driver.Lease, ttl time.Duration) []error {
	b.batches.Add(1)
	b.leases.Add(int32(len(leases)))
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = l.Refresh(ctx, ttl)
	}
	return errs
}

// Locks taken at different moments fall into step: after the first period,
// renewing them all takes one batch per period.
func TestRenewalsBatchIntoOneRequestPerPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ttl := 1500 * time.Millisecond
		bc := &batchCounter{Locker: memory.New()}
		g := newBubbleGuard(t, bc, guard.WithTTL(ttl))
		ctx := context.Background()
		var locks []*guard.Lock
		// 300 locks spread over a whole renewal period.
		for i := range 300 {
			l, err := g.Lock(ctx, "batch/"+strconv.Itoa(i))
			if err != nil {
				t.Fatal(err)
			}
			locks = append(locks, l)
			time.Sleep(ttl / 3 / 300)
		}
		time.Sleep(ttl) // let them fall into step
		b0, l0 := bc.batches.Load(), bc.leases.Load()
		periods := 4
		time.Sleep(time.Duration(periods) * ttl / 3)
		batches, renewed := bc.batches.Load()-b0, bc.leases.Load()-l0
		for _, l := range locks {
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("unlock: %v", err)
			}
		}
		t.Logf("%d batches renewing %d leases over %d periods", batches, renewed, periods)
		if max := int32(2 * (periods + 1)); batches > max {
			t.Errorf("%d batches over %d renewal periods of 300 locks, want at most %d", batches, periods, max)
		}
		if renewed < int32(300*(periods-1)) {
			t.Errorf("only %d lease renewals over %d periods of 300 locks", renewed, periods)
		}
	})
}

// A renewal of locks of different TTLs sends one batch per TTL, and renews
// each lease for its own.
func TestBatchRenewalPerTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bc := &batchCounter{Locker: memory.New()}
		g := newBubbleGuard(t, bc, guard.WithTTL(3*time.Second))
		ctx := context.Background()
		start := time.Now()
		ttls := map[*guard.Lock]time.Duration{}
		for i := range 3 {
			for _, ttl := range []time.Duration{1500 * time.Millisecond, 3 * time.Second, 2400 * time.Millisecond} {
				l, err := g.Lock(ctx, fmt.Sprintf("%v/%d", ttl, i), guard.TTL(ttl))
				if err != nil {
					t.Fatal(err)
				}
				ttls[l] = ttl
			}
		}
		// The shortest TTL's renewal falls due a third of it after the
		// grant and brings forward the others, due within its period.
		time.Sleep(600 * time.Millisecond)
		synctest.Wait()
		if n, m := bc.batches.Load(), bc.leases.Load(); n != 3 || m != 9 {
			t.Errorf("%d batches renewing %d leases, want 3 (one per TTL) renewing 9", n, m)
		}
		renewed := start.Add(500 * time.Millisecond)
		for l, ttl := range ttls {
			if got, want := l.Expiry(), renewed.Add(ttl); !got.Equal(want) {
				t.Errorf("%s: expiry %v after the start, want %v", l.Key(), got.Sub(start), want.Sub(start))
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// limited declares etcd-like TTL limits.
type limited struct{ *memory.Locker }

func (limited) Limits() driver.Limits {
	return driver.Limits{MinTTL: 2 * time.Second, TTLStep: time.Second}
}

func TestTTLCheckedAgainstTheBackendsLimits(t *testing.T) {
	lk := limited{memory.New()}
	for _, ttl := range []time.Duration{time.Second, 1500 * time.Millisecond, -time.Second} {
		if _, err := guard.New(lk, guard.WithTTL(ttl)); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("New(WithTTL(%v)) on a backend of whole seconds from 2s: %v, want ErrInvalidOption", ttl, err)
		}
	}
	g := newGuard(t, lk, guard.WithTTL(3*time.Second))
	if err := g.ValidateTTL(2500 * time.Millisecond); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("ValidateTTL(2.5s): %v, want ErrInvalidOption", err)
	}
	err := g.Do(context.Background(), "k", func(context.Context, *guard.Lock) error { return nil }, guard.TTL(2500*time.Millisecond))
	if !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("Do with TTL(2.5s): %v, want ErrInvalidOption", err)
	}
	if _, err := guard.New(memory.New(), guard.WithTTL(time.Second), guard.WithSafetyMargin(600*time.Millisecond)); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("a margin over half the TTL: %v, want ErrInvalidOption", err)
	}
	if err := g.Do(context.Background(), "k", nil); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("Do with a nil function: %v, want ErrInvalidOption", err)
	}
}

// A renewal that has moved the lease's Expiry (the server renewed it) keeps
// the lock, even when its answer reaches the keeper late, as the results of
// a large batch do: the keeper reads the lease's Expiry before declaring it
// lost.
func TestRenewedLeaseIsNotLostWhileItsAnswerIsLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFaulty(t)
		f.renewThenHang.Store(true)
		const ttl = 2 * time.Second
		g := newBubbleGuard(t, f, guard.WithTTL(ttl))
		l, err := g.TryLock(context.Background(), "late-answer")
		if err != nil {
			t.Fatal(err)
		}
		firstLoss := l.Expiry().Add(-ttl / 10)
		waitFor(t, "a renewal to be sent", 10*time.Second, func() bool { return f.refreshes.Load() > 0 })
		time.Sleep(time.Until(firstLoss.Add(100 * time.Millisecond)))
		err = l.Err()
		// The renewal moved the lease to about ttl after it was sent; past that
		// (a machine too slow to look in time) the check says nothing.
		if time.Now().After(firstLoss.Add(ttl / 3)) {
			t.Skip("looked too late to tell")
		}
		if err != nil {
			t.Fatalf("a lease the server renewed was declared lost at its old deadline: %v", err)
		}
	})
}

// A section's context is made when the section first looks at it; one that
// looks only after its lock was lost, released or its parent cancelled sees
// it already cancelled, with the right cause.
func TestLockContextMadeLateKeepsItsCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFaulty(t)
		g := newBubbleGuard(t, f, guard.WithTTL(300*time.Millisecond))
		notHeld := driver.ErrNotHeld
		f.refreshErr.Store(&notHeld)
		l, err := g.TryLock(context.Background(), "late-look")
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the lock to be lost", 10*time.Second, func() bool { return l.Err() != nil })
		ctx := l.Context()
		select {
		case <-ctx.Done():
		default:
			t.Fatal("the context of a lost lock is not done")
		}
		if cause := context.Cause(ctx); !errors.Is(cause, guard.ErrLockLost) {
			t.Errorf("cause %v, want ErrLockLost", cause)
		}
		l.Unlock(context.Background())

		f.refreshErr.Store(nil)
		parent, cancel := context.WithCancelCause(context.Background())
		l2, err := g.TryLock(parent, "late-look-2")
		if err != nil {
			t.Fatal(err)
		}
		stop := errors.New("parent stopped")
		cancel(stop)
		if cause := context.Cause(l2.Context()); !errors.Is(cause, stop) {
			t.Errorf("after the parent's cancellation: cause %v, want the parent's", cause)
		}
		l2.Unlock(context.Background())

		l3, err := g.TryLock(context.Background(), "late-look-3")
		if err != nil {
			t.Fatal(err)
		}
		l3.Unlock(context.Background())
		if err := l3.Context().Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("after Unlock: %v, want context.Canceled", err)
		}
	})
}

// TestFailedReleaseAfterExpiryIsALoss: a process paused past its lease (the
// keeper's timer has not fired yet when the section ends) whose release
// then gets no answer must report the loss, from Unlock and as its
// context's cause: another owner may have held the lock meanwhile. The same
// failed release within the lease is only a failed release.
func TestFailedReleaseAfterExpiryIsALoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		unanswered := fmt.Errorf("%w: no answer", driver.ErrUnavailable)
		for _, expired := range []bool{true, false} {
			sl := newSessionLocker(time.Hour)
			g := newBubbleGuard(t, sl, guard.WithTTL(3*time.Second))
			l, err := g.Lock(ctx, "paused")
			if err != nil {
				t.Fatal(err)
			}
			_ = l.Context().Done() // the section looked at its context early
			if expired {
				// As a SIGSTOP past the session's expiry leaves it: the timer
				// armed for an hour from now has not fired.
				sl.sess.mu.Lock()
				sl.sess.expiry = time.Now().Add(-time.Second)
				sl.sess.mu.Unlock()
			}
			sl.releaseErr.Store(&unanswered)
			err = l.Unlock(ctx)
			cause := context.Cause(l.Context())
			if expired {
				if !errors.Is(err, guard.ErrLockLost) || !errors.Is(cause, guard.ErrLockLost) {
					t.Fatalf("expired lease, failed release: Unlock %v, cause %v; want both to wrap ErrLockLost", err, cause)
				}
			} else if errors.Is(err, guard.ErrLockLost) || !errors.Is(err, guard.ErrUnavailable) || errors.Is(cause, guard.ErrLockLost) {
				t.Fatalf("live lease, failed release: Unlock %v, cause %v; want ErrUnavailable and no loss", err, cause)
			}
			close(sl.sess.done) // ends the keeper's watch of the session
		}
	})
}

// The loss deadlines, to the instant, in fake time: a lease no renewal
// confirms is lost exactly its margin before its conservative expiry,
// whether its renewal hangs or fails; a refusal (ErrNotHeld) loses it at
// the renewal that hears it; a session not renewed loses its locks its
// margin before the session's expiry.
func TestLossDeadlinesToTheInstant(t *testing.T) {
	const ttl, margin = 900 * time.Millisecond, 250 * time.Millisecond
	down := fmt.Errorf("%w: connection refused", guard.ErrUnavailable)
	notHeld := error(guard.ErrNotHeld)
	for _, tc := range []struct {
		name   string
		fault  func(f *faulty)
		lostAt time.Duration // after the grant
	}{
		{"hung renewal", func(f *faulty) { f.refreshBlock.Store(true) }, ttl - margin},
		{"failing renewals", func(f *faulty) { f.refreshErr.Store(&down) }, ttl - margin},
		{"refused renewal", func(f *faulty) { f.refreshErr.Store(&notHeld) }, ttl / 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFaulty(t)
				tc.fault(f)
				g := newBubbleGuard(t, f, guard.WithTTL(ttl), guard.WithSafetyMargin(margin))
				l, err := g.Lock(context.Background(), "k")
				if err != nil {
					t.Fatal(err)
				}
				granted := time.Now()
				<-l.Context().Done()
				if got := time.Since(granted); got != tc.lostAt {
					t.Errorf("lost %v after the grant, want %v", got, tc.lostAt)
				}
				if !errors.Is(context.Cause(l.Context()), guard.ErrLockLost) {
					t.Errorf("cause %v, want ErrLockLost", context.Cause(l.Context()))
				}
				if err := l.Unlock(context.Background()); !errors.Is(err, guard.ErrLockLost) {
					t.Errorf("Unlock: %v, want ErrLockLost", err)
				}
			})
		})
	}
	t.Run("session", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			sl := newSessionLocker(ttl)
			g := newBubbleGuard(t, sl, guard.WithTTL(ttl), guard.WithSafetyMargin(margin))
			l, err := g.Lock(context.Background(), "k")
			if err != nil {
				t.Fatal(err)
			}
			for range 5 {
				time.Sleep(ttl / 3)
				sl.sess.renew(ttl)
			}
			expiry := sl.sess.Expiry()
			<-l.Context().Done()
			if got := time.Until(expiry); got != margin {
				t.Errorf("lost %v before the session's expiry, want the margin %v", got, margin)
			}
			l.Unlock(context.Background())
			close(sl.sess.done)
		})
	})
}

// Locks taken amid many short sections, which end before their renewal is
// due and overflow the keeper's stack of young locks again and again, are
// still renewed while held, listed by Held, and none is lost; the short
// sections leave nothing behind.
func TestYoungLocksRenewedAmidChurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		ttl := 900 * time.Millisecond
		g := newBubbleGuard(t, memory.New(), guard.WithTTL(ttl))
		var held []*guard.Lock
		for i := range 300 {
			l, err := g.TryLock(ctx, fmt.Sprintf("held/%d", i))
			if err != nil {
				t.Fatal(err)
			}
			if i%3 == 0 {
				held = append(held, l)
			} else if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			for range 5 {
				if err := g.Do(ctx, "short", func(context.Context, *guard.Lock) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
			if i%50 == 0 {
				time.Sleep(ttl / 7)
			}
		}
		if got := g.Held(); len(got) != len(held) {
			t.Fatalf("Held lists %d locks before any renewal, want the %d held", len(got), len(held))
		}
		time.Sleep(5 * ttl)
		synctest.Wait()
		for _, l := range held {
			if err := l.Err(); err != nil {
				t.Fatalf("lock %s: %v after five TTLs held", l.Key(), err)
			}
			if left := time.Until(l.Expiry()); left < ttl/2 {
				t.Fatalf("lock %s expires in %v: not renewed", l.Key(), left)
			}
		}
		if got := g.Held(); len(got) != len(held) {
			t.Fatalf("Held lists %d locks, want the %d held", len(got), len(held))
		}
		for _, l := range held {
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := g.Held(); len(got) != 0 {
			t.Fatalf("Held lists %d locks after every unlock", len(got))
		}
	})
}

// slowBatch is the memory backend with a batch refresh that takes delay,
// or until its ctx ends, whichever comes first.
type slowBatch struct {
	*memory.Locker
	delay time.Duration
}

func (b *slowBatch) RefreshBatch(ctx context.Context, leases []driver.Lease, ttl time.Duration) []error {
	errs := make([]error, len(leases))
	select {
	case <-ctx.Done():
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	case <-time.After(b.delay):
	}
	for i, l := range leases {
		errs[i] = l.Refresh(context.Background(), ttl)
	}
	return errs
}

// A batch renewal slower than the earliest lease in it has left must still
// renew the others: its answer is awaited until the latest loss deadline
// of the batch, and each lease whose own deadline passes first is lost on
// that deadline. Cut off at the earliest deadline, a slow batch failed
// every lease in it, and each retry, with less time left, failed again.
func TestSlowBatchRenewsTheLeasesItHasTimeFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ttl, margin := 3*time.Second, 250*time.Millisecond
		// Renewals fall due a third of the TTL after each grant (1 s), and
		// the one due within the coming third goes in the same batch: a
		// granted at 0 (lost at 2.75 s unless renewed), b at 0.9 s (lost at
		// 3.65 s). The batch sent at 1 s answers at 3.2 s.
		sb := &slowBatch{Locker: memory.New(), delay: 2200 * time.Millisecond}
		g := newBubbleGuard(t, sb, guard.WithTTL(ttl), guard.WithSafetyMargin(margin))
		ctx := context.Background()
		a, err := g.Lock(ctx, "slow/a")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(900 * time.Millisecond)
		b, err := g.Lock(ctx, "slow/b")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(1900 * time.Millisecond) // 2.8 s: past a's deadline, before the answer
		if a.Err() == nil {
			t.Error("a is not lost on its deadline while the batch renewing it is unanswered")
		}
		time.Sleep(time.Second) // 3.8 s: past the answer and b's first deadline
		if err := b.Err(); err != nil {
			t.Errorf("b lost although the batch renewed it before its deadline: %v", err)
		}
		_ = a.Unlock(ctx)
		if err := b.Unlock(ctx); err != nil {
			t.Errorf("unlock b: %v", err)
		}
	})
}

// A failed renewal is retried a tenth of the TTL later, and once one
// succeeds, the next falls due a third of the TTL after it: the retry's
// time, which the keeper keeps beside the failure rather than in the
// Lock, goes with the failure.
func TestFailedRenewalRetriedThenOnSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFaulty(t)
		down := fmt.Errorf("%w: connection refused", guard.ErrUnavailable)
		f.refreshErr.Store(&down)
		const ttl = 3 * time.Second
		g := newBubbleGuard(t, f, guard.WithTTL(ttl))
		start := time.Now()
		l, err := g.Lock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		refreshesAt := func(at time.Duration, want int32) {
			t.Helper()
			time.Sleep(time.Until(start.Add(at)))
			synctest.Wait()
			if n := f.refreshes.Load(); n != want {
				t.Errorf("%d refreshes %v after the grant, want %d", n, at, want)
			}
		}
		refreshesAt(ttl/3+time.Millisecond, 1) // due a third of the TTL in: fails
		f.refreshErr.Store(nil)
		refreshesAt(ttl/3+ttl/10-time.Millisecond, 1)
		refreshesAt(ttl/3+ttl/10+time.Millisecond, 2) // retried a tenth of the TTL later: renews
		refreshesAt(ttl/3+ttl/10+ttl/3-time.Millisecond, 2)
		refreshesAt(ttl/3+ttl/10+ttl/3+time.Millisecond, 3) // then a third of the TTL after that
		refreshesAt(2*ttl, 6)
		if err := l.Err(); err != nil {
			t.Errorf("lock after a failed renewal and its retry: %v", err)
		}
		if err := l.Unlock(context.Background()); err != nil {
			t.Error(err)
		}
	})
}

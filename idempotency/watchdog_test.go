package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/idempotency"
)

// extendCounter counts the renewals of the store beneath it, and answers
// them with fail when it is set.
type extendCounter struct {
	idempotency.Store
	calls atomic.Int64
	fail  atomic.Pointer[error]
}

func failing(st idempotency.Store, err error) *extendCounter {
	s := &extendCounter{Store: st}
	s.fail.Store(&err)
	return s
}

func (s *extendCounter) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	s.calls.Add(1)
	if err := s.fail.Load(); err != nil {
		return *err
	}
	return s.Store.Extend(ctx, scope, key, owner, lease)
}

// The watchdog's timing runs on the fake clock of a synctest bubble, so
// that each test can say exactly when renewals happen and when fn is told
// its claim is lost.

// TestWatchdogRenewsEveryThirdOfLease: while fn runs, the claim is renewed
// every third of the lease and nothing else; the minimum lease renews at a
// bounded rate, never in a tight loop.
func TestWatchdogRenewsEveryThirdOfLease(t *testing.T) {
	for _, lease := range []time.Duration{30 * time.Millisecond, idempotency.MinDuration} {
		t.Run(lease.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &extendCounter{Store: idempotency.NewMemoryStore()}
				e := newExecutor(t, st, idempotency.WithLease(lease))
				run := 10 * lease
				_, err := e.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
					time.Sleep(run)
					if ctx.Err() != nil {
						return nil, fmt.Errorf("fn's context ended while its claim was renewed: %v", context.Cause(ctx))
					}
					return []byte("ok"), nil
				})
				if err != nil {
					t.Fatal(err)
				}
				// Ticks at lease/3, 2*lease/3, ... up to run: 30 of them, the
				// last racing fn's return.
				if n := st.calls.Load(); n < 29 || n > 30 {
					t.Errorf("%d renewals in %v with a lease of %v, want 29 or 30 (one per third of the lease)", n, run, lease)
				}
			})
		})
	}
}

// TestWatchdogUnreachableStore: renewals that fail for want of the store are
// retried each period until a tenth of the lease, measured from before the
// claim was sent, is left; then fn's context ends with ErrNotOwner, not
// before, so that fn stops before the store can free the key.
func TestWatchdogUnreachableStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 30 * time.Millisecond
		st := failing(idempotency.NewMemoryStore(), fmt.Errorf("%w: partitioned", idempotency.ErrUnavailable))
		e := newExecutor(t, st, idempotency.WithLease(lease))
		start := time.Now()
		var lostAfter time.Duration
		_, err := e.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			<-ctx.Done()
			lostAfter = time.Since(start)
			return nil, context.Cause(ctx)
		})
		if !errors.Is(err, idempotency.ErrNotOwner) {
			t.Errorf("Do: %v, want the ErrNotOwner fn saw", err)
		}
		if want := lease - lease/10; lostAfter != want {
			t.Errorf("fn told of the loss after %v, want exactly a tenth before the lease, %v", lostAfter, want)
		}
		if n := st.calls.Load(); n != 2 {
			t.Errorf("%d renewal attempts, want 2 (one per third, until then)", n)
		}
	})
}

// TestWatchdogNotOwner: a renewal answered ErrNotOwner (the claim was taken
// over or deleted) ends fn's context at once.
func TestWatchdogNotOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 30 * time.Millisecond
		st := failing(idempotency.NewMemoryStore(), idempotency.ErrNotOwner)
		e := newExecutor(t, st, idempotency.WithLease(lease))
		start := time.Now()
		var lostAfter time.Duration
		e.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			<-ctx.Done()
			lostAfter = time.Since(start)
			return nil, context.Cause(ctx)
		})
		if lostAfter != lease/3 || st.calls.Load() != 1 {
			t.Errorf("lost after %v and %d renewals, want %v and 1", lostAfter, st.calls.Load(), lease/3)
		}
	})
}

// TestWatchdogOutlivesCaller: the caller giving up does not stop the
// renewals: fn finishing long after it still completes the key, and a
// duplicate meanwhile is told the key is in progress.
func TestWatchdogOutlivesCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 30 * time.Millisecond
		st := &extendCounter{Store: idempotency.NewMemoryStore()}
		e := newExecutor(t, st, idempotency.WithLease(lease))
		ctx, cancel := context.WithCancel(context.Background())
		var dupErr error
		_, err := e.Do(ctx, "k", "fp", func(context.Context) ([]byte, error) {
			cancel()
			time.Sleep(5 * lease)
			_, dupErr = e.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) { return nil, nil })
			time.Sleep(5 * lease)
			return []byte("finished"), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(dupErr, idempotency.ErrInProgress) {
			t.Errorf("duplicate after five leases of a cancelled caller: %v, want ErrInProgress", dupErr)
		}
		if n := st.calls.Load(); n < 29 {
			t.Errorf("%d renewals in ten leases after the caller left, want 29 or more", n)
		}
		res, err := e.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) { return []byte("second run"), nil })
		if err != nil || !res.Replayed || string(res.Response) != "finished" {
			t.Errorf("after fn finished: (%q, replayed %v, %v), want its result replayed", res.Response, res.Replayed, err)
		}
	})
}

// TestWatchdogDetachedRun: with WithDetachedRun, fn's context survives its
// caller's cancellation and ends only when the claim is lost.
func TestWatchdogDetachedRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 30 * time.Millisecond
		st := &extendCounter{Store: idempotency.NewMemoryStore()}
		e := newExecutor(t, st, idempotency.WithLease(lease), idempotency.WithDetachedRun())
		ctx, cancel := context.WithCancel(context.Background())
		var afterCaller error
		var lostAfter time.Duration
		e.Do(ctx, "k", "fp", func(fctx context.Context) ([]byte, error) {
			cancel()
			time.Sleep(lease)
			afterCaller = fctx.Err()
			start := time.Now()
			lost := idempotency.ErrNotOwner // the claim is taken from here on
			st.fail.Store(&lost)
			<-fctx.Done()
			lostAfter = time.Since(start)
			return nil, context.Cause(fctx)
		})
		if afterCaller != nil {
			t.Errorf("fn's context ended with its caller's: %v", afterCaller)
		}
		if lostAfter > lease/3 {
			t.Errorf("fn told of the lost claim after %v, want within one renewal period, %v", lostAfter, lease/3)
		}
	})
}

// slowExtend makes the renewals take delays[i] (the i-th renewal; none
// past the list), past their deadline as a store that ignores deadlines
// does, and notes when each began.
type slowExtend struct {
	idempotency.Store
	delays []time.Duration
	calls  atomic.Int64
	starts chan time.Time
}

func (s *slowExtend) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	s.starts <- time.Now()
	if i := int(s.calls.Add(1)) - 1; i < len(s.delays) {
		time.Sleep(s.delays[i])
	}
	return s.Store.Extend(context.WithoutCancel(ctx), scope, key, owner, lease)
}

// TestWatchdogSlowRenewalKeepsTheTicks: a renewal that runs past the next
// tick (answered within the grace past its bound, the renewal period) is
// followed at once by one more, as with a ticker, and the renewals after
// it fall on the ticks again; stopping the watch waits for the renewal in
// flight, so none begins after Do returns.
func TestWatchdogSlowRenewalKeepsTheTicks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lease := 300 * time.Millisecond
		tick := lease / 3
		slow := tick + tick/10
		st := &slowExtend{Store: idempotency.NewMemoryStore(), delays: []time.Duration{slow, 0, 0, slow}, starts: make(chan time.Time, 100)}
		e := newExecutor(t, st, idempotency.WithLease(lease))
		start := time.Now()
		if _, err := e.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			time.Sleep(4*tick + tick/2)
			return []byte("ok"), nil
		}); err != nil {
			t.Fatal(err)
		}
		returned := time.Now()
		close(st.starts)
		var got []time.Duration
		for at := range st.starts {
			got = append(got, at.Sub(start))
		}
		// Ticks at 1, 2, 3, 4: the renewal of tick 1 runs to 2.1, so the
		// one for tick 2 begins then; tick 3's and 4's on time, and the
		// last runs to 5.1, past fn's return at 4.5.
		want := []time.Duration{tick, 2*tick + tick/10, 3 * tick, 4 * tick}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("renewals began at %v, want %v", got, want)
		}
		if d := returned.Sub(start); d != 4*tick+slow {
			t.Fatalf("Do returned after %v, want %v: stop waits for the renewal in flight", d, 4*tick+slow)
		}
	})
}

// unanswered fails the first two renewals at once (connection refused) and
// leaves every later one without an answer until its context ends (a
// black-holed connection, or a client that ignores deadlines), never
// reaching the store beneath.
type unanswered struct {
	idempotency.Store
	calls atomic.Int64
}

func (s *unanswered) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	if s.calls.Add(1) <= 2 {
		return fmt.Errorf("%w: connection refused", idempotency.ErrUnavailable)
	}
	<-ctx.Done()
	return fmt.Errorf("%w: %w", idempotency.ErrUnavailable, ctx.Err())
}

// TestWatchdogToldBeforeUnrenewedClaimRunsOut: a caller cut off from the
// store has its claim run out on the store's clock one lease after it was
// made, and another caller then claims the key and runs the work. fn is
// told (ErrNotOwner) a tenth of the lease before that, not when a renewal
// left waiting gives up, a third of a lease later.
func TestWatchdogToldBeforeUnrenewedClaimRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 30 * time.Millisecond
		mem := idempotency.NewMemoryStore()
		a := newExecutor(t, &unanswered{Store: mem}, idempotency.WithLease(lease))
		b := newExecutor(t, mem, idempotency.WithLease(lease))
		start := time.Now()
		told := make(chan time.Duration, 1)
		go a.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), idempotency.ErrNotOwner) {
				t.Errorf("fn told %v, want ErrNotOwner", context.Cause(ctx))
			}
			told <- time.Since(start)
			return nil, context.Cause(ctx)
		})
		time.Sleep(lease + time.Millisecond)
		var started time.Duration
		if _, err := b.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) {
			started = time.Since(start)
			return []byte("b"), nil
		}); err != nil {
			t.Fatalf("the other caller: %v", err)
		}
		if at := <-told; at != lease-lease/10 || started <= at {
			t.Errorf("fn told at %v, the other caller's work started at %v: want told at %v, before", at, started, lease-lease/10)
		}
	})
}

// lateAnswer makes each claim at once and answers it after delay: a slow
// network, or a client library that resent the command and waited.
type lateAnswer struct {
	idempotency.Store
	delay time.Duration
}

func (s *lateAnswer) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	rec, err := s.Store.Claim(ctx, c)
	time.Sleep(s.delay)
	return rec, err
}

// TestClaimAnsweredTooLateDoesNotRun: a claim answered when less than the
// margin of its lease is left, or none, is given back and fn does not run,
// since the store may free the key before fn could be told; one answered
// in time runs.
func TestClaimAnsweredTooLateDoesNotRun(t *testing.T) {
	const lease = 30 * time.Millisecond
	for _, tc := range []struct {
		delay time.Duration
		runs  bool
	}{{26 * time.Millisecond, true}, {27 * time.Millisecond, false}, {40 * time.Millisecond, false}} {
		t.Run(tc.delay.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := idempotency.NewMemoryStore()
				e := newExecutor(t, &lateAnswer{Store: mem, delay: tc.delay}, idempotency.WithLease(lease))
				var runs atomic.Int64
				_, err := e.Do(context.Background(), "k", "fp", counted(&runs, "x"))
				switch {
				case tc.runs && (err != nil || runs.Load() != 1):
					t.Errorf("answered in time: %d runs, %v", runs.Load(), err)
				case !tc.runs && (!errors.Is(err, idempotency.ErrUnavailable) || runs.Load() != 0):
					t.Errorf("answered too late: %d runs, %v; want none and ErrUnavailable", runs.Load(), err)
				case !tc.runs:
					// Given back: a retry runs at once.
					if _, err := mem.Get(context.Background(), "", "k"); !errors.Is(err, idempotency.ErrNotFound) {
						t.Errorf("the late claim was not given back: %v", err)
					}
				}
			})
		})
	}
}

// resending sends each claim twice, answering the second: what go-redis
// does with a command whose answer did not come within its read timeout.
type resending struct{ idempotency.Store }

func (s resending) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if _, err := s.Store.Claim(ctx, c); err != nil {
		return nil, err
	}
	return s.Store.Claim(ctx, c)
}

// TestClaimResentFindsItsOwn: the resent claim finds the in-progress record
// the first one made, under this call's own owner token: fn runs under it
// rather than being refused as a duplicate of itself, which would leave the
// key blocked, with nobody working, for a whole lease.
func TestClaimResentFindsItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := idempotency.NewMemoryStore()
		e := newExecutor(t, resending{mem})
		var runs atomic.Int64
		res, err := e.Do(context.Background(), "k", "fp", counted(&runs, "x"))
		if err != nil || runs.Load() != 1 || string(res.Response) != "x" {
			t.Fatalf("%d runs, %q, %v: want fn run once", runs.Load(), res.Response, err)
		}
		if rec, err := mem.Get(context.Background(), "", "k"); err != nil || rec.State != idempotency.StateCompleted {
			t.Errorf("record %+v, %v: want completed", rec, err)
		}
	})
}

// watched is a ClaimWatcher whose claims end when the test closes gone.
type watched struct {
	idempotency.Store
	gone chan struct{}
}

func (s watched) ClaimDone(scope, key, owner string) <-chan struct{} { return s.gone }

// TestClaimWatcherStopsFn: fn is told ErrNotOwner as soon as a
// ClaimWatcher store says the claim may be gone, not at the next renewal
// (a third of a lease later) and not before; a run that ends first leaves
// nothing waiting on the store's channel (the bubble would not end).
func TestClaimWatcherStopsFn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 30 * time.Second
		st := watched{Store: idempotency.NewMemoryStore(), gone: make(chan struct{})}
		e := newExecutor(t, st, idempotency.WithLease(lease))
		if _, err := e.Do(context.Background(), "quick", "fp", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		go func() {
			time.Sleep(2 * time.Second)
			close(st.gone)
		}()
		_, err := e.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			<-ctx.Done()
			if at := time.Since(start); at != 2*time.Second {
				t.Errorf("fn told at %v, want when the store said so, 2s", at)
			}
			return nil, context.Cause(ctx)
		})
		if !errors.Is(err, idempotency.ErrNotOwner) {
			t.Errorf("Do: %v, want ErrNotOwner", err)
		}
	})
}

// TestLateClaimToldAtItsMargin: a claim answered with less than a third of
// its lease left, so before its first renewal would be due, still has fn
// told a tenth of the lease before it could run out, however the renewals
// fare.
func TestLateClaimToldAtItsMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 30 * time.Millisecond
		e := newExecutor(t, &lateAnswer{Store: &unanswered{Store: idempotency.NewMemoryStore()}, delay: 25 * time.Millisecond},
			idempotency.WithLease(lease))
		toldAtMargin(t, e, lease)
	})
}

// toldAtMargin runs a Do on e whose fn waits for its context to end, and
// checks that it ended a tenth of the lease before an unrenewed claim
// could run out, and Do said ErrNotOwner.
func toldAtMargin(t *testing.T, e *idempotency.Executor, lease time.Duration) {
	t.Helper()
	start := time.Now()
	_, err := e.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
		<-ctx.Done()
		if at := time.Since(start); at != lease-lease/10 {
			t.Errorf("fn told at %v, want %v", at, lease-lease/10)
		}
		return nil, context.Cause(ctx)
	})
	if !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Do: %v, want ErrNotOwner", err)
	}
}

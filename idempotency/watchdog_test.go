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
// retried each period until the claim's lease, measured from before the
// claim was sent, has run out; then fn's context ends with ErrNotOwner, not
// before.
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
		if lostAfter != lease {
			t.Errorf("fn told of the loss after %v, want exactly the lease, %v", lostAfter, lease)
		}
		if n := st.calls.Load(); n != 3 {
			t.Errorf("%d renewal attempts within one lease, want 3 (one per third)", n)
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

// slowExtend makes every renewal take delay, past its deadline as a store
// that ignores deadlines does, and notes when each began.
type slowExtend struct {
	idempotency.Store
	delay  time.Duration
	starts chan time.Time
}

func (s *slowExtend) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	s.starts <- time.Now()
	time.Sleep(s.delay)
	return s.Store.Extend(context.WithoutCancel(ctx), scope, key, owner, lease)
}

// TestWatchdogSlowRenewalKeepsTheTicks: a renewal that runs past the next
// tick is followed at once by one more, as with a ticker, and the renewals
// after it fall on the ticks again; stopping the watch waits for the
// renewal in flight, so none begins after Do returns.
func TestWatchdogSlowRenewalKeepsTheTicks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lease := 300 * time.Millisecond
		tick := lease / 3
		st := &slowExtend{Store: idempotency.NewMemoryStore(), delay: tick + tick/2, starts: make(chan time.Time, 100)}
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
		// Ticks at 1, 2, 3, 4: the renewal of tick 1 runs to 2.5, so the
		// one for tick 2 begins then, runs to 4, and the one for tick 4
		// begins at once.
		want := []time.Duration{tick, 2*tick + tick/2, 4 * tick}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("renewals began at %v, want %v", got, want)
		}
		if d := returned.Sub(start); d != 4*tick+tick+tick/2 {
			t.Fatalf("Do returned after %v, want %v: stop waits for the renewal in flight", d, 4*tick+tick+tick/2)
		}
	})
}

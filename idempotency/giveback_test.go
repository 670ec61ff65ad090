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

// lostClaims is a store whose Claim reaches the store beneath it but whose
// answer is lost: the caller gets an error while the claim is made, at once
// or delay later (a request still on its way when the caller gave up).
type lostClaims struct {
	idempotency.Store
	delay time.Duration
	made  atomic.Bool // a claim was made for a caller that got an error
}

func (s *lostClaims) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	claim := func() {
		if rec, err := s.Store.Claim(context.WithoutCancel(ctx), c); rec == nil && err == nil {
			s.made.Store(true)
		}
	}
	if s.delay == 0 {
		claim()
	} else {
		time.AfterFunc(s.delay, claim)
	}
	return nil, errors.New("connection reset")
}

// TestLostClaimGivenBack: a claim made by a call that failed (its answer
// lost, at once or landing later) is abandoned, so that a retry runs fn
// within seconds instead of waiting out the claim's lease as in progress.
func TestLostClaimGivenBack(t *testing.T) {
	for _, delay := range []time.Duration{0, 300 * time.Millisecond, 1500 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := idempotency.NewMemoryStore()
				ls := &lostClaims{Store: st, delay: delay}
				lost := newExecutor(t, ls)
				ctx := context.Background()
				if _, err := lost.Do(ctx, "k", "", func(context.Context) ([]byte, error) {
					t.Error("fn ran after a failed claim")
					return nil, nil
				}); !errors.Is(err, idempotency.ErrUnavailable) {
					t.Fatalf("Do with a lost claim: %v, want ErrUnavailable", err)
				}
				time.Sleep(delay + time.Millisecond)
				if !ls.made.Load() {
					t.Fatal("the store made no claim for the failed call")
				}

				e := newExecutor(t, st)
				start := time.Now()
				deadline := start.Add(idempotency.DefaultLease / 2)
				for {
					ran := false
					_, err := e.Do(ctx, "k", "", func(context.Context) ([]byte, error) { ran = true; return []byte("ok"), nil })
					if err == nil && ran {
						break
					}
					if !errors.Is(err, idempotency.ErrInProgress) || time.Now().After(deadline) {
						t.Fatalf("retry %v after the lost claim: %v (ran %v), want fn run within %v", time.Since(start), err, ran, deadline.Sub(start))
					}
					time.Sleep(50 * time.Millisecond)
				}
				if waited := time.Since(start); waited > 10*time.Second {
					t.Errorf("the retry ran fn %v after the lost claim, want the claim given back within 10s", waited)
				}
			})
		})
	}
}

// outageStore is a store in an outage: Claim fails at once, and Abandon gets
// no answer until its ctx ends. It counts the Abandon calls, and the most
// that waited at once.
type outageStore struct {
	idempotency.Store
	abandons, waiting, most atomic.Int64
}

func (s *outageStore) Claim(context.Context, idempotency.Claim) (*idempotency.Record, error) {
	return nil, idempotency.ErrUnavailable
}

func (s *outageStore) Abandon(ctx context.Context, scope, key, owner string) error {
	s.abandons.Add(1)
	n := s.waiting.Add(1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	<-ctx.Done()
	s.waiting.Add(-1)
	return ctx.Err()
}

// TestGiveBacksBounded: in an outage, the give-backs of failed claims are
// bounded in number at once and in time, so that failing requests do not
// pile up goroutines and requests against a store that answers none.
func TestGiveBacksBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &outageStore{Store: idempotency.NewMemoryStore()}
		e := newExecutor(t, st)
		const calls = 1000
		for i := range calls {
			if _, err := e.Do(context.Background(), fmt.Sprint("k", i), "", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idempotency.ErrUnavailable) {
				t.Fatalf("Do in an outage: %v, want ErrUnavailable", err)
			}
		}
		start := time.Now()
		synctest.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := st.waiting.Load(); n != 0 {
			t.Errorf("%d give-back requests still waiting a minute later", n)
		}
		if most, total := st.most.Load(), st.abandons.Load(); most > 64 || total > 64*4 {
			t.Errorf("give-backs: %d requests at once, %d in all for %d failed claims; want at most 64 and 256", most, total, calls)
		}
		t.Logf("%d failed claims: %d give-back requests, at most %d at once, over %v", calls, st.abandons.Load(), st.most.Load(), time.Since(start))
	})
}

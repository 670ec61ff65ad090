package idempotency_test

import (
	"context"
	"errors"
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
	for _, delay := range []time.Duration{0, 300 * time.Millisecond, 3 * time.Second} {
		t.Run(delay.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := idempotency.NewMemoryStore()
				ls := &lostClaims{Store: st, delay: delay}
				lost, err := idempotency.New(ls)
				if err != nil {
					t.Fatal(err)
				}
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

				e, err := idempotency.New(st)
				if err != nil {
					t.Fatal(err)
				}
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

package scheduler_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

// slowStore is a healthy slot store 20 ms away: every call answers, in 20 ms.
type slowStore struct{ idempotency.Store }

func (s slowStore) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	time.Sleep(20 * time.Millisecond)
	return s.Store.Claim(ctx, c)
}

func (s slowStore) Complete(ctx context.Context, scope, key, owner string, resp []byte, ret time.Duration) error {
	time.Sleep(20 * time.Millisecond)
	return s.Store.Complete(ctx, scope, key, owner, resp, ret)
}

// TestManyJobsDueAtOnceOnAHealthyStore: 80 jobs due at the same instant,
// on a store that answers every call in 20 ms, all run: calls answered in
// time take none of the room kept for calls left behind (maxBehind).
func TestManyJobsDueAtOnceOnAHealthyStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o outcomes
		s := bubbleScheduler(t, newGuard(t, memory.New()), "solo", &o,
			scheduler.WithSlotStore(slowStore{idempotency.NewMemoryStore()}))
		var ran atomic.Int32
		for i := range 80 {
			if err := s.Add("@every 10s", fmt.Sprint("job-", i), func(context.Context) error { ran.Add(1); return nil }); err != nil {
				t.Fatal(err)
			}
		}
		s.Start()
		time.Sleep(10*time.Second + time.Second)
		synctest.Wait()
		failed := 0
		for _, r := range o.all() {
			if r.Outcome == scheduler.Failed {
				failed++
				if failed == 1 {
					t.Logf("first failure: %s %v", r.Reason, r.Err)
				}
			}
		}
		if failed > 0 || ran.Load() != 80 {
			t.Errorf("ran %d of 80, %d failed against a healthy store", ran.Load(), failed)
		}
	})
}

// extendHangs is a slot store whose Extend ignores its context and answers
// only after 30 s (a client that waits out its own timeouts and retries).
type extendHangs struct{ idempotency.Store }

func (s extendHangs) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	time.Sleep(30 * time.Second)
	return s.Store.Extend(ctx, scope, key, owner, lease)
}

// TestRunEndsWhileItsRenewalHangs: with CatchUp, a run whose slot claim
// renewal hangs in a client that ignores its context still ends (completes
// its slot, releases its lock, is recorded) when its job returns: the
// renewal is bounded and no longer waited for.
func TestRunEndsWhileItsRenewalHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var recorded time.Time
		var rec scheduler.RunRecord
		s := newScheduler(t, newGuard(t, memory.New()), scheduler.WithInstance("solo"),
			scheduler.WithSlotStore(extendHangs{idempotency.NewMemoryStore()}),
			scheduler.WithRunObserver(func(r scheduler.RunRecord) {
				mu.Lock()
				defer mu.Unlock()
				if recorded.IsZero() && r.Outcome == scheduler.Ran {
					recorded, rec = time.Now(), r
				}
			}))
		var returned time.Time
		err := s.Add("@every 1m", "job", func(context.Context) error {
			time.Sleep(3 * time.Second) // past a third of the 3 s claim lease: a renewal is in flight
			mu.Lock()
			if returned.IsZero() {
				returned = time.Now()
			}
			mu.Unlock()
			return nil
		}, scheduler.CatchUp(), scheduler.MisfireAfter(10*time.Second), scheduler.LockTTL(3*time.Second), scheduler.LockAtLeastFor(0))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		time.Sleep(6 * time.Minute)
		synctest.Wait()
		mu.Lock()
		if recorded.IsZero() {
			mu.Unlock()
			t.Fatal("no run recorded")
		}
		t.Logf("outcome %s; the job returned %v after its slot; the run was recorded (slot completed, lock released) %v after the job returned", rec.Outcome, returned.Sub(rec.Slot), recorded.Sub(returned))
		if d := recorded.Sub(returned); d > 0 {
			t.Errorf("the run's end waited %v for a renewal", d)
		}
		mu.Unlock()
		stop(t, s)
		time.Sleep(5 * time.Minute) // the hung renewals end
	})
}

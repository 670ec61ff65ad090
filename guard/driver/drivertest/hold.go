package drivertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// HeavyTests is the Exclusive name of the tests that take thousands of
// locks or load the machine: run one at a time, they measure the backend
// rather than each other.
const HeavyTests = "heavy"

// HoldMany takes n locks on l through a guard.Guard with ttl, keeps them
// for hold while Load keeps a CPU busy, and fails t if the lease keeper
// lost any of them or could not release one. It is the many-locks test every
// backend runs (n = 10,000 with a 3s ttl): renewals must keep up on a loaded
// machine, in the round trips the backend needs for them.
//
// It is skipped under the race detector, whose slowdown of the client, not
// the backend, would decide whether renewals keep up; make test runs it
// again without -race.
func HoldMany(t *testing.T, l driver.Locker, n int, ttl, hold time.Duration) {
	t.Helper()
	if raceEnabled {
		t.Skip("timing of 10,000 renewals: run without -race (make test does)")
	}
	// One such test at a time on the machine: the load is one other
	// process's, not another package's test doing the same.
	Exclusive(t, HeavyTests)
	g, err := guard.New(l, guard.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prefix := fmt.Sprintf("hold-many/%d", time.Now().UnixNano())
	locks := make([]*guard.Lock, 0, n)
	defer func() {
		for _, lk := range locks {
			_ = lk.Unlock(ctx)
		}
	}()
	for i := range n {
		lk, err := g.TryLock(ctx, fmt.Sprintf("%s/%d", prefix, i))
		if err != nil {
			t.Fatalf("lock %d of %d: %v", i, n, err)
		}
		locks = append(locks, lk)
	}
	stop := Load(t)
	// A window to observe, not a condition to wait for: every renewal in it
	// must succeed.
	time.Sleep(hold)
	stop()
	for i, lk := range locks {
		if err := lk.Err(); err != nil {
			t.Errorf("lock %d of %d lost while held on a loaded machine: %v", i, n, err)
			break
		}
	}
	failed := 0
	var first error
	for _, lk := range locks {
		if err := lk.Unlock(ctx); err != nil {
			if failed == 0 {
				first = err
			}
			failed++
		}
	}
	locks = nil
	if failed > 0 {
		t.Fatalf("%d of %d locks were lost or not released: first %v", failed, n, first)
	}
}

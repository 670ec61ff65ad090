package redislock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

// TestReshardFencedWrite: while the slot of a resource moves, a fenced
// write whose keys are not all on one node (the fence there, the data key
// not yet written) is answered TRYAGAIN, and Redis ran nothing. The write
// waits for the slot to settle, as the Locker's scripts do, and fails with
// its ctx's error when ctx ends first (here at the first TRYAGAIN): it is
// not refused for good, and its outcome is known (not sent:
// driver.ErrNotSent).
func TestReshardFencedWrite(t *testing.T) {
	c := startReshardCluster(t, 2)
	cc := c.client()
	f, err := NewFence(cc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	short, cancel := context.WithCancel(ctx)
	defer cancel()
	cc.AddHook(cancelOnMigration{cancel})
	const res = "{reshard-fence}"
	if err := f.Set(ctx, fence.Claim{Resource: res, Token: 1}, res+":a", "1", 0); err != nil {
		t.Fatal(err)
	}
	slot := c.slot(f.Key(res))
	src := c.owner(slot)
	done := make(chan error, 1)
	first := true
	c.moveSlot(slot, src, c.other(src), 1, func() {
		if !first {
			return
		}
		first = false
		// Nothing moved yet: the fence and ":a" are on src, ":b" nowhere.
		// short ends at the first TRYAGAIN.
		err := f.Set(short, fence.Claim{Resource: res, Token: 2}, res+":b", "2", 0)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("a fenced write whose context ends while its slot moves: %v, want the context's error", err)
		}
		if errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, driver.ErrNotSent) {
			t.Errorf("a fenced write refused with TRYAGAIN: %v, which does not say that it changed nothing (driver.ErrNotSent)", err)
		}
		go func() {
			long, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			done <- f.Set(long, fence.Claim{Resource: res, Token: 3}, res+":b", "3", 0)
		}()
	})
	if err := <-done; err != nil {
		t.Fatalf("a fenced write sent while its slot moved: %v, want it written once the slot settled", err)
	}
	if v, err := cc.Get(ctx, res+":b").Result(); err != nil || v != "3" {
		t.Errorf("the data key holds %q (%v), want 3", v, err)
	}
	if high, err := f.Highest(ctx, res); err != nil || high != 3 {
		t.Errorf("the fence's highest token is %d (%v), want 3", high, err)
	}
}

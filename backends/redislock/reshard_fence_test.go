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
// waits for the slot to settle, as the Locker's scripts do, and says that
// Redis is unavailable when its ctx ends first: it is not refused for good,
// and its outcome is known.
func TestReshardFencedWrite(t *testing.T) {
	c := startReshardCluster(t, 2)
	cc := c.client()
	f, err := NewFence(cc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
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
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := f.Set(short, fence.Claim{Resource: res, Token: 2}, res+":b", "2", 0)
		cancel()
		if !errors.Is(err, driver.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a fenced write within 300ms while its slot moves: %v, want it unavailable", err)
		}
		if errors.Is(err, ErrOutcomeUnknown) {
			t.Errorf("a fenced write refused with TRYAGAIN: %v, which says that its outcome is unknown", err)
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

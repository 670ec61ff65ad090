package guard_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestGrantTooLateToHold: a lease granted only after it ran out, or so
// close to its end that the loss margin has begun, is not handed to the
// caller as held, where another can take the lock: Lock and Do fail with
// ErrUnavailable, the work does not start, and the lease is given back.
// One answered with time to spare is held as usual.
func TestGrantTooLateToHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		d := &drivertest.LateGrants{Locker: mem}
		g, err := guard.New(d, guard.WithTTL(3*time.Second), guard.WithIdleCallers(0))
		if err != nil {
			t.Fatal(err)
		}
		other, err := guard.New(mem, guard.WithTTL(3*time.Second), guard.WithIdleCallers(0))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		// Past its end, and within the margin (a tenth of the TTL) of it.
		for _, late := range []time.Duration{4 * time.Second, 2800 * time.Millisecond} {
			d.Late = late
			ran := false
			err := g.Do(ctx, "k", func(context.Context, *guard.Lock) error {
				ran = true
				return nil
			})
			if !errors.Is(err, guard.ErrUnavailable) || ran {
				t.Errorf("granted %v late: Do %v, fn ran %v; want ErrUnavailable and no run", late, err, ran)
			}
			if l, err := g.Lock(ctx, "k"); !errors.Is(err, guard.ErrUnavailable) || l != nil {
				t.Errorf("granted %v late: Lock %v, %v; want ErrUnavailable and no lock", late, l, err)
			}
			synctest.Wait()
			l, err := other.Lock(ctx, "k", guard.NoWait())
			if err != nil {
				t.Errorf("granted %v late: the lease was not given back: %v", late, err)
				continue
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		d.Late = time.Second
		l, err := g.Lock(ctx, "k")
		if err != nil {
			t.Fatalf("granted 1s late of a 3s TTL: %v, want it held", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

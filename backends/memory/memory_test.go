package memory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

func TestConformance(t *testing.T) {
	// One Locker is one process's lock table: every "client" of the suite
	// shares it, as goroutines of a single-process program would.
	shared := memory.New()
	drivertest.Run(t, drivertest.Backend{
		NewLocker: func(testing.TB) driver.Locker { return shared },
		TTL:       300 * time.Millisecond,
		FIFO:      true,
		Waiters:   func(_ testing.TB, key string) int { return shared.Waiters(key) },
	})
}

// TestWhyNotHeld: a lease no longer held says why, since its holder's
// section is cancelled with that as the cause: taken away by ForceRelease
// before it ran out (an operator's release is no expiry), run out, or
// released already.
func TestWhyNotHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := memory.New()
		opts := driver.AcquireOptions{TTL: 3 * time.Second}
		want := func(what string, err error, says string) {
			t.Helper()
			if !errors.Is(err, driver.ErrNotHeld) || !strings.Contains(err.Error(), says) {
				t.Errorf("%s: %v, want ErrNotHeld saying %q", what, err, says)
			}
		}

		forced, err := l.Acquire(ctx, "forced", opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.ForceRelease(ctx, "forced", driver.ReleaseTarget{AnyHolder: true}); err != nil {
			t.Fatal(err)
		}
		want("Refresh after ForceRelease", forced.Refresh(ctx, 3*time.Second), "ForceRelease")
		want("Release after ForceRelease", forced.Release(ctx), "ForceRelease")

		ran, err := l.Acquire(ctx, "ran-out", opts)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second)
		want("Refresh after the TTL", ran.Refresh(ctx, 3*time.Second), "expired")

		twice, err := l.Acquire(ctx, "twice", opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := twice.Release(ctx); err != nil {
			t.Fatal(err)
		}
		want("a second Release", twice.Release(ctx), "released already")
	})
}

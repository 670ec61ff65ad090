package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestDoubleReleaseKeepsHeartbeats: a lease released twice (the second
// Release reports ErrNotHeld) counts once: the Locker goes on sending
// heartbeats for the leases it still holds, so that their session's Expiry
// keeps moving and they are not taken for lost while the session is
// healthy.
func TestDoubleReleaseKeepsHeartbeats(t *testing.T) {
	l := dial(t, servers(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kept, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Release(ctx)
	twice, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	if err := twice.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := twice.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	// Two heartbeats: the first may have been under way already.
	n := l.heartbeats.Load()
	eventually(t, "two more heartbeats", func() bool { return l.heartbeats.Load() >= n+2 })
	if time.Until(kept.Expiry()) <= 0 {
		t.Errorf("the kept lease's Expiry %v has passed on a healthy session", kept.Expiry())
	}
}

package drivertest

import (
	"math"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// testLongestTTL: the longest TTL the backend's Limits allow, a TTL of
// math.MaxInt64 where they set no bound, holds the lock: its expiry is
// ahead, after an acquisition and a refresh alike, and another client
// finds the lock held. Sums of such a TTL with a clock overflow into the
// past.
func testLongestTTL(t *testing.T, b *Backend) {
	l1, l2 := b.NewLocker(t), b.NewLocker(t)
	lim := driver.LimitsOf(l1)
	ttl := time.Duration(math.MaxInt64)
	if lim.MaxTTL > 0 {
		ttl = lim.MaxTTL
	}
	if lim.TTLStep > 0 {
		ttl -= ttl % lim.TTLStep
	}
	if err := lim.CheckTTL(ttl); err != nil {
		t.Fatalf("the longest TTL its Limits (%+v) allow, %v, refused: %v", lim, ttl, err)
	}
	ctx := b.ctx(t)
	k := key(t)
	lease := mustAcquire(t, l1, ctx, k, driver.AcquireOptions{TTL: ttl})
	defer release(t, lease)
	// A lease's Expiry may be well short of its TTL (a session's is
	// counted from the session's last heartbeat), but not in the past,
	// nor decades short of a TTL of centuries.
	ahead := func(what string) {
		t.Helper()
		want := time.Now()
		if century := 100 * 365 * 24 * time.Hour; ttl > century {
			want = want.Add(century)
		}
		if e := lease.Expiry(); e.Before(want) {
			t.Errorf("Expiry after %s with a TTL of %v: %v, want after %v", what, ttl, e, want)
		}
	}
	ahead("the acquisition")
	expectNotAcquired(t, l2, ctx, k, b.opts(false))
	if err := lease.Refresh(ctx, ttl); err != nil {
		t.Fatalf("Refresh(%v): %v", ttl, err)
	}
	ahead("a refresh")
	expectNotAcquired(t, l2, ctx, k, b.opts(false))
}

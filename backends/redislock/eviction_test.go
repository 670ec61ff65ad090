package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestEvictionLosesLocks is what doc.go says of a server whose maxmemory
// policy evicts keys: under memory pressure it evicts held locks (every
// key warden writes has an expiry, so a volatile-* policy may take them
// too), and another process takes them while their holders still hold
// them, as after a restart without persistence. What holds: the other
// process's token is above the holder's, and the holder's next renewal
// fails with ErrNotHeld, which cancels its section.
func TestEvictionLosesLocks(t *testing.T) {
	s := drivertest.StartRedis(t, "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru")
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx := context.Background()
	oc := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer oc.Close()
	holder, other := newLocker(t, c), newLocker(t, oc)
	const locks = 100
	held := make([]driver.Lease, locks)
	for i := range held {
		var err error
		if held[i], err = holder.Acquire(ctx, "evicted/"+strconv.Itoa(i), driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	// An application's cache beside the locks, 20 MB of it.
	value := strings.Repeat("x", 10_000)
	for i := range 2000 {
		if err := c.Set(ctx, "cache/"+strconv.Itoa(i), value, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	twice := 0
	for i, h := range held {
		l, err := other.Acquire(ctx, "evicted/"+strconv.Itoa(i), driver.AcquireOptions{TTL: time.Minute})
		if errors.Is(err, driver.ErrNotAcquired) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		twice++
		if l.Token() <= h.Token() {
			t.Errorf("lock %d taken again with token %d, not above its holder's %d", i, l.Token(), h.Token())
		}
		if err := h.Refresh(ctx, time.Minute); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("holder's refresh of evicted lock %d: got %v, want ErrNotHeld", i, err)
		}
	}
	t.Logf("allkeys-lru, maxmemory 4mb: %d of %d held locks evicted and taken by another process", twice, locks)
	if twice == 0 {
		t.Fatal("no lock was evicted: doc.go's figure is out of date")
	}
}

package redlock

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

// TestEvictionLosesVotes is what doc.go says of nodes whose maxmemory
// policy evicts keys: under memory pressure a majority of them evicts the
// votes of held locks (every vote's key has an expiry, so a volatile-*
// policy takes them too), and another process takes the locks while their
// holders still hold them, as after a majority's restart without
// persistence. What holds: the holders' next renewal fails with
// ErrNotHeld, which cancels their sections.
func TestEvictionLosesVotes(t *testing.T) {
	servers := []*drivertest.RedisServer{
		drivertest.StartRedis(t, "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"),
		drivertest.StartRedis(t, "--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru"),
		drivertest.StartRedis(t),
	}
	ctx := context.Background()
	holder := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	other := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	opts := driver.AcquireOptions{TTL: time.Minute}
	held := make([]driver.Lease, 100)
	for i := range held {
		var err error
		if held[i], err = holder.Acquire(ctx, "evicted/"+strconv.Itoa(i), opts); err != nil {
			t.Fatal(err)
		}
	}
	// An application's cache beside the votes, 20 MB of it on each of the
	// two nodes that evict.
	value := strings.Repeat("x", 10_000)
	for _, s := range servers[:2] {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		for i := range 2000 {
			if err := c.Set(ctx, "cache/"+strconv.Itoa(i), value, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	twice := 0
	for i, h := range held {
		_, err := other.Acquire(ctx, "evicted/"+strconv.Itoa(i), opts)
		if errors.Is(err, driver.ErrNotAcquired) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		twice++
		if err := h.Refresh(ctx, opts.TTL); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("holder's refresh of lock %d, its votes evicted: got %v, want ErrNotHeld", i, err)
		}
	}
	t.Logf("2 of 3 nodes allkeys-lru and volatile-lru, maxmemory 4mb: %d of %d held locks taken by another process", twice, len(held))
	if twice == 0 {
		t.Error("no held lock was taken again: the hazard doc.go describes is gone")
	}
}

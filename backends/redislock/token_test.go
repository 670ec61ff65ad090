package redislock

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// privateClient is a client of a redis-server of the test's own, whose
// INFO commandstats nobody else moves, and the server's address.
func privateClient(t *testing.T) (*goredis.Client, string) {
	t.Helper()
	addr := drivertest.StartRedis(t).Addr()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c, addr
}

// grant takes and releases key on addr, returning the token.
func grant(t *testing.T, addr, key string) uint64 {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	l := newLocker(t, c)
	lease, err := l.Acquire(context.Background(), key, driver.AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return lease.Token()
}

// TestTokensGrowAcrossLostFences: the fence counter lives in Redis and is
// lost with the data, by a restart without persistence or by a failover to
// a replica that missed the latest grants; the tokens issued afterwards
// must still be greater than every token issued before.
func TestTokensGrowAcrossLostFences(t *testing.T) {
	t.Run("restart without persistence", func(t *testing.T) {
		s := drivertest.StartRedis(t)
		var last uint64
		for range 5 {
			last = grant(t, s.Addr(), "k")
		}
		s.Restart(t)
		if next := grant(t, s.Addr(), "k"); next <= last {
			t.Fatalf("token %d after the restart, not greater than %d before it", next, last)
		}
	})
	t.Run("failover to a lagging replica", func(t *testing.T) {
		primary := drivertest.StartRedis(t).Addr()
		host, port, _ := net.SplitHostPort(primary)
		replica := drivertest.StartRedis(t, "--replicaof", host, port).Addr()
		grant(t, primary, "k")
		rc := goredis.NewClient(&goredis.Options{Addr: replica})
		defer rc.Close()
		ctx := context.Background()
		deadline := time.Now().Add(15 * time.Second)
		for rc.Exists(ctx, "{k}:lock").Val() != 1 {
			if time.Now().After(deadline) {
				t.Fatal("the replica never got the fence")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// The replica is cut off, then the primary grants more: the replica
		// that is promoted next has missed them, as after an asynchronous
		// failover.
		if err := rc.ReplicaOf(ctx, "no", "one").Err(); err != nil {
			t.Fatal(err)
		}
		var last uint64
		for range 5 {
			last = grant(t, primary, "k")
		}
		if next := grant(t, replica, "k"); next <= last {
			t.Fatalf("token %d on the promoted replica, not greater than %d granted before the failover", next, last)
		}
	})
}

// TestFenceExpiresLongAfterItsLastGrant: the fence of a key, the one key a
// lock leaves behind (a plain or fair lock's state, the fence counter of the
// other kinds), expires a day after the key's last grant at the earliest, and
// two days after at the latest, so that lock names used once (per user, per
// order) do not stay in Redis for ever; and a grant after it expired still
// draws a token greater than every token before.
func TestFenceExpiresLongAfterItsLastGrant(t *testing.T) {
	c := newClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: time.Second}
	kinds := []struct {
		name    string
		state   bool // the fence is the lock's state
		acquire func(key string) (driver.Lease, error)
	}{
		{"mutex", true, func(key string) (driver.Lease, error) { return l.Acquire(ctx, key, opts) }},
		{"fair mutex", true, func(key string) (driver.Lease, error) {
			return l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Second, Fair: true})
		}},
		{"read", false, func(key string) (driver.Lease, error) { return l.AcquireRead(ctx, key, opts) }},
		{"write", false, func(key string) (driver.Lease, error) { return l.AcquireWrite(ctx, key, opts) }},
		{"permit", false, func(key string) (driver.Lease, error) { return l.AcquireSemaphore(ctx, key, 2, opts) }},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			key := "fence-expiry-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			fence, longest := namesOf(key).fence(), 24*time.Hour
			if k.state {
				fence, longest = namesOf(key).lock(), 48*time.Hour
			}
			t.Cleanup(func() { c.Del(ctx, fence) })
			var last uint64
			for range 3 {
				lease, err := k.acquire(key)
				if err != nil {
					t.Fatal(err)
				}
				last = lease.Token()
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
				pttl, err := c.PTTL(ctx, fence).Result()
				if err != nil {
					t.Fatal(err)
				}
				if pttl < 23*time.Hour || pttl > longest {
					t.Fatalf("the fence's PTTL after a grant: %v, want a day to %v", pttl, longest)
				}
			}
			// The day has passed: the fence is gone.
			if err := c.Del(ctx, fence).Err(); err != nil {
				t.Fatal(err)
			}
			lease, err := k.acquire(key)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			if lease.Token() <= last {
				t.Fatalf("token %d after the fence expired, not greater than %d before", lease.Token(), last)
			}
		})
	}
}

// TestReleaseKeepsTheDayOfTheGrant: a plain lock's grant that found nobody
// waiting does not say which day it set the key to expire at, and the lease
// works it out from this process's clock. A lease whose guess is wrong (a
// clock far off, midnight in between) still releases, and the free state
// keeps the day, and the expiry, that the grant set.
func TestReleaseKeepsTheDayOfTheGrant(t *testing.T) {
	c := newClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	key := "release-day-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	lockKey := namesOf(key).lock()
	t.Cleanup(func() { c.Del(ctx, lockKey) })
	stateDay := func() string {
		t.Helper()
		v, err := c.Get(ctx, lockKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.SplitN(v, ":", 5)
		if len(f) != 5 {
			t.Fatalf("state %q, want deadline:token:day:waiting:owner", v)
		}
		return f[2]
	}
	for _, off := range []uint32{0, 1, ^uint32(0)} {
		g, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		granted := stateDay()
		ls := g.(*lease)
		if off == 0 && strconv.FormatUint(uint64(ls.day.Load()), 10) != granted {
			t.Fatalf("the lease's day %d, the state's %s", ls.day.Load(), granted)
		}
		ls.day.Add(off)
		if err := g.Release(ctx); err != nil {
			t.Fatalf("release with the day off by %d: %v", int32(off), err)
		}
		if day := stateDay(); day != granted {
			t.Fatalf("the free state's day %s after a release whose day was off by %d, want %s", day, int32(off), granted)
		}
		v, err := c.Get(ctx, lockKey).Result()
		if err != nil || !strings.HasPrefix(v, "0:") || !strings.HasSuffix(v, ":") {
			t.Fatalf("state %q after the release (%v), want a free one", v, err)
		}
		if pttl := c.PTTL(ctx, lockKey).Val(); pttl < 23*time.Hour {
			t.Fatalf("the state's PTTL %v after the release, want a day at least", pttl)
		}
	}
}

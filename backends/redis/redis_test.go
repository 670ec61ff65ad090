package redis

import (
	"context"
	"strconv"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/backendtest"
	"github.com/warden-go/warden/guard"
)

const addrEnv, addrDefault = "WARDEN_REDIS_ADDR", "127.0.0.1:16379"

// newClient connects to the shared test server, as a separate process would.
func newClient(t testing.TB) *goredis.Client {
	t.Helper()
	addr := backendtest.Addr(t, addrEnv, addrDefault)
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// waiters counts the live waiters recorded for key: fair waiters and
// waiting writers.
func waiters(t testing.TB, c goredis.UniversalClient, l *Locker, key string) int {
	t.Helper()
	ctx := context.Background()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	min := strconv.FormatInt(now.UnixMilli(), 10)
	k := l.keys(key)
	n := 0
	for _, z := range []string{k.deadlines, k.writeWaiters} {
		c, err := c.ZCount(ctx, z, "("+min, "+inf").Result()
		if err != nil {
			t.Fatalf("ZCOUNT %s: %v", z, err)
		}
		n += int(c)
	}
	return n
}

func TestConformance(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run("fair="+strconv.FormatBool(fair), func(t *testing.T) {
			b := backendtest.Backend{
				NewLocker: func(t testing.TB) guard.Locker { return New(newClient(t)) },
				FIFO:      fair,
			}
			if fair {
				probe := newClient(t)
				b.Waiters = func(t testing.TB, key string) int { return waiters(t, probe, New(probe), key) }
			}
			backendtest.Run(t, b)
		})
	}
	// The suite asks for fair mode only in its FIFO and cancellation tests;
	// this run sends every acquisition through the queue, so mutual
	// exclusion, expiry and wake-ups are proven for fair mode too.
	t.Run("fair=always", func(t *testing.T) {
		probe := newClient(t)
		backendtest.Run(t, backendtest.Backend{
			NewLocker: func(t testing.TB) guard.Locker { return alwaysFair{New(newClient(t))} },
			FIFO:      true,
			Waiters:   func(t testing.TB, key string) int { return waiters(t, probe, New(probe), key) },
		})
	})
}

// alwaysFair is a Locker that asks for fair mode on every acquisition.
type alwaysFair struct{ l *Locker }

func (f alwaysFair) Acquire(ctx context.Context, key string, opts guard.AcquireOptions) (guard.Lease, error) {
	opts.Fair = true
	return f.l.Acquire(ctx, key, opts)
}

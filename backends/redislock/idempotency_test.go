package redislock

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

func TestIdempotencyStoreConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) idempotency.Store { return newStore(t, newClient(t)) },
		storetest.Lease(300*time.Millisecond),
		// A client that ends its calls by their contexts' deadlines, on
		// which the store is DeadlineBounded.
		storetest.Silence(func(t testing.TB) (idempotency.Store, func()) {
			p := drivertest.StartProxy(t, drivertest.Addr(t, addrEnv, addrDefault))
			c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			return newStore(t, c), p.Blackhole
		}))
}

// TestNewStoreNilOption: a nil option is refused with an error naming it,
// where it used to be skipped in silence.
func TestNewStoreNilOption(t *testing.T) {
	st, err := NewStore(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), nil)
	if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "nil StoreOption") {
		t.Errorf("NewStore(client, nil): (%v, %v), want ErrInvalidOption naming the nil StoreOption", st, err)
	}
}

// TestDurationsRoundedUp: leases, retentions and TTLs go to Redis in whole
// milliseconds rounded up, so that Redis never keeps one for less than
// was asked (a claim's lease of 1.999ms was sent as 1ms, less than the
// Executor's margin for a lease of a few milliseconds), and a duration of
// math.MaxInt64 stays positive (adding a millisecond to round it
// overflowed into the past).
func TestDurationsRoundedUp(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Millisecond, 1},
		{1999 * time.Microsecond, 2},
		{2 * time.Second, 2000},
		{math.MaxInt64, math.MaxInt64/int64(time.Millisecond) + 1},
	} {
		if got := ms(c.d); got != c.want {
			t.Errorf("ms(%v) = %d, want %d", c.d, got, c.want)
		}
		if got := pxOf(c.d); got != c.want {
			t.Errorf("pxOf(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

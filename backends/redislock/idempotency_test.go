package redislock

import (
	"errors"
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

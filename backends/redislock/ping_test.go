package redislock

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestPing: with go-redis's default options, whose read timeout ignores the
// ctx deadline, Ping of a server that stopped answering still returns by
// the deadline.
func TestPing(t *testing.T) {
	p := drivertest.StartProxy(t, drivertest.Addr(t, addrEnv, addrDefault))
	cut := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
	t.Cleanup(func() { cut.Close() })
	p.Blackhole()
	up := newClient(t)
	t.Run("Locker", func(t *testing.T) { drivertest.CheckPing(t, newLocker(t, up), newLocker(t, cut)) })
	t.Run("Store", func(t *testing.T) { drivertest.CheckPing(t, newStore(t, up), newStore(t, cut)) })
}

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

// TestOutOfMemorySaysSo: a server out of memory under noeviction refuses
// the writes of every acquisition, renewal and release; each fails as
// unavailable with the server's OOM error, not as a lock held by another
// and not as a server too old for warden.
func TestOutOfMemorySaysSo(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: drivertest.StartRedis(t).Addr()})
	defer c.Close()
	ctx := context.Background()
	l := newLocker(t, c)
	plain, err := l.Acquire(ctx, "plain", driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fair, err := l.Acquire(ctx, "fair", driver.AcquireOptions{TTL: time.Minute, Fair: true})
	if err != nil {
		t.Fatal(err)
	}
	// A server already over a maxmemory of 1 byte refuses every write.
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") || strings.Contains(err.Error(), "6.2") {
			t.Errorf("%s out of memory: got %v, want ErrUnavailable with the server's OOM error", what, err)
		}
	}
	for _, o := range []driver.AcquireOptions{{TTL: time.Second}, {TTL: time.Second, Fair: true}} {
		_, err := l.Acquire(ctx, "free", o)
		check("acquire (fair "+strconv.FormatBool(o.Fair)+")", err)
	}
	check("refresh", plain.Refresh(ctx, time.Minute))
	check("fair refresh", fair.Refresh(ctx, time.Minute))
	for _, err := range l.RefreshBatch(ctx, []driver.Lease{plain, fair}, time.Minute) {
		check("batch refresh", err)
	}
	check("release", plain.Release(ctx))
	check("fair release", fair.Release(ctx))
}

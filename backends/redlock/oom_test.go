package redlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// TestOutOfMemorySaysSo: masters out of memory under noeviction refuse
// the writes of every vote, renewal and withdrawal; each fails as
// unavailable with the servers' OOM error, not as a server too old for
// warden.
func TestOutOfMemorySaysSo(t *testing.T) {
	servers := startServers(t, 3)
	l := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	ctx := context.Background()
	held, err := l.Acquire(ctx, "held", driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		// A server already over a maxmemory of 1 byte refuses every
		// write.
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
			if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") || strings.Contains(err.Error(), "6.2") {
			t.Errorf("%s out of memory: got %v, want ErrUnavailable with the servers' OOM error", what, err)
		}
	}
	_, err = l.Acquire(ctx, "free", driver.AcquireOptions{TTL: time.Second})
	check("acquire", err)
	check("refresh", held.Refresh(ctx, time.Minute))
	check("release", held.Release(ctx))
}

package redislock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

func TestZZUsec(t *testing.T) {
	addr, _ := privateServer(t, 0)
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	l := newLocker(t, c)
	ctx := context.Background()
	usec := func() float64 {
		var total float64
		for _, line := range strings.Split(c.Info(ctx, "commandstats").Val(), "\n") {
			if !strings.HasPrefix(line, "cmdstat_evalsha:") {
				continue
			}
			for _, f := range strings.Split(strings.TrimSpace(line), ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					x, _ := strconv.ParseFloat(v, 64)
					total += x
				}
			}
		}
		return total
	}
	for _, fair := range []bool{false, true} {
		opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Fair: fair}
		u0 := usec()
		const n = 3000
		for range n {
			ls, err := l.Acquire(ctx, "u", opts)
			if err != nil {
				t.Fatal(err)
			}
			ls.Release(ctx)
		}
		t.Logf("fair=%v: %.2f server µs per uncontended cycle", fair, (usec()-u0)/n)
	}
}

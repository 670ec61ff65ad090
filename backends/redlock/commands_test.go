package redlock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// calls sums the calls of every command in the INFO commandstats of the
// servers, the commands scripts run included, the INFO calls excepted.
func calls(t *testing.T, servers []*server) int64 {
	t.Helper()
	var total int64
	for _, s := range servers {
		c := goredis.NewClient(&goredis.Options{Addr: s.addr})
		info, err := c.Info(context.Background(), "commandstats").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
				continue
			}
			for f := range strings.SplitSeq(stats, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					total += n
				}
			}
		}
	}
	return total
}

// TestUncontendedCycleCommands: once a Locker has heard the nodes' fences,
// an uncontended acquisition and release cost 5 server commands a node
// (the vote: EVALSHA, TIME, SET; the withdrawal: EVALSHA, SET), counted by
// the servers themselves.
func TestUncontendedCycleCommands(t *testing.T) {
	servers := startServers(t, 3)
	l := privateLocker(t, servers, nil)
	ctx := context.Background()
	cycle := func() {
		lease, err := l.Acquire(ctx, "cycle", driver.AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // the Locker learns the fences
	cycle()
	time.Sleep(100 * time.Millisecond) // the withdrawals left in the background
	const n = 50
	before := calls(t, servers)
	for range n {
		cycle()
	}
	time.Sleep(100 * time.Millisecond)
	per := float64(calls(t, servers)-before) / n / float64(len(servers))
	t.Logf("server commands per cycle and node: %v", per)
	if per > 5.5 {
		t.Errorf("server commands per uncontended cycle and node: %v, want 5", per)
	}
}

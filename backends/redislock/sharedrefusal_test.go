package redislock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestRefusedSharedScriptsLeaveNothing: the scripts of read/write locks
// and semaphores that write a member of a sorted set (a reader, a permit,
// a writer's wait), or a writer's key, fail as a whole when the server
// refuses one of their calls (an ACL user without one of the documented
// rules, each left out in turn): every key but the fence is left as it
// was. A script is not rolled back: a call refused after the write left
// the member or the writer in the name of a caller told that it failed (a
// permit or a read hold until its deadline, a writer's wait keeping readers
// out), or a refreshed deadline the holder was told was not. The scripts
// are run directly, not through an acquisition, whose cleanup would take
// such a leftover back afterwards, when it can.
func TestRefusedSharedScriptsLeaveNothing(t *testing.T) {
	ctx := context.Background()
	srv := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer admin.Close()
	n := namesOf("warden:shared/refused")
	rw := []string{n.readers(), n.writer(), n.writeWaiters(), n.fence()}
	const owner = "OWNER/refused"
	// member writes a member of set whose deadline is secs from now, and
	// gives the set as long an expiry.
	member := func(set, m string, secs int64) {
		now, err := admin.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.ZAdd(ctx, set, goredis.Z{Score: float64(now.UnixMilli() + secs*1000), Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.Expire(ctx, set, time.Duration(secs)*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	scr := newScripts()
	readAcquire, writeAcquire, semAcquire := scr.readAcquire, scr.writeAcquire, scr.semAcquire
	permits := []string{n.permits(), n.fence()}
	cases := []struct {
		name   string
		setup  func()
		script *goredis.Script
		keys   []string
		args   []any
	}{
		{"read grant", func() {}, readAcquire, rw, []any{owner, 60000}},
		{"read grant beside a reader", func() { member(n.readers(), "other", 10) }, readAcquire, rw, []any{owner, 60000}},
		{"permit grant", func() {}, semAcquire, permits, []any{owner, 60000, 2}},
		{"permit grant beside a holder", func() { member(n.permits(), "other", 10) }, semAcquire, permits, []any{owner, 60000, 2}},
		{"write grant to a waiter", func() { member(n.writeWaiters(), owner, 5) }, writeAcquire, rw, []any{owner, 60000, "1", 5000}},
		{"write wait", func() { member(n.readers(), "other", 10) }, writeAcquire, rw, []any{owner, 60000, "1", 5000}},
		{"write wait renewed", func() {
			member(n.readers(), "other", 10)
			member(n.writeWaiters(), owner, 2)
		}, writeAcquire, rw, []any{owner, 60000, "1", 5000}},
		{"read refresh", func() { member(n.readers(), owner, 10) }, scr.zrefresh, rw[:1], []any{owner, 60000}},
	}
	refused := 0
	for _, rule := range aclRules {
		if !strings.HasPrefix(rule, "+") {
			continue
		}
		setUserWithout(t, admin, rule)
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Username: "w", Password: "pw"})
		for _, tc := range cases {
			if err := admin.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			tc.setup()
			before := keysState(t, admin)
			err := tc.script.Run(ctx, c, tc.keys, tc.args...).Err()
			if err == nil {
				continue
			}
			refused++
			if after := keysState(t, admin); !slices.Equal(after, before) {
				t.Errorf("%s without %s: %v; the keys went from\n\t%q\nto\n\t%q", tc.name, rule, err, before, after)
			}
		}
		c.Close()
	}
	if refused == 0 {
		t.Error("no script was refused")
	}
}

// keysState describes every key on the server but the fences, which a
// refused grant may have moved (a token is drawn before the grant's
// writes, and tokens need only grow): its name, its value and whether it
// expires.
func keysState(t *testing.T, admin *goredis.Client) []string {
	t.Helper()
	ctx := context.Background()
	keys, err := admin.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		if strings.HasSuffix(k, ":fence") {
			continue
		}
		var v any
		switch typ := admin.Type(ctx, k).Val(); typ {
		case "zset":
			v = admin.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "string":
			v = admin.Get(ctx, k).Val()
		default:
			v = typ
		}
		expiry := "expires"
		if admin.PTTL(ctx, k).Val() < 0 {
			expiry = "never expires"
		}
		out = append(out, fmt.Sprintf("%s=%v (%s)", k, v, expiry))
	}
	return out
}

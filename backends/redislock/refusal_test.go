package redislock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestRefusalEndsTheWait: a request the server refuses whatever happens
// meanwhile (an ACL user without EVALSHA, without the lock's keys or
// without the commands the scripts call, EVALSHA or TIME renamed away) ends a waiting acquisition at once with
// the server's words, as it does one that does not wait, rather than wait
// out the caller's context and say only that it ended.
func TestRefusalEndsTheWait(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	for user, rules := range map[string][]any{
		"noevalsha": {"~*", "&*", "+@all", "-evalsha"},
		"nokeys":    {"~other:*", "&*", "+@all"},
		// Scripts only: every script is refused from inside, at its first
		// call (Redis 7.0: "The user executing the script can't run this
		// command", 7.2: "ACL failure in script").
		"scriptsonly": {"~*", "&*", "+evalsha", "+eval"},
	} {
		if err := admin.Do(ctx, append([]any{"acl", "setuser", user, "on", ">pw"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	renamed := drivertest.StartRedis(t, "--rename-command", "evalsha", "")
	noTime := drivertest.StartRedis(t, "--rename-command", "time", "")
	cases := []struct {
		name string
		opts goredis.Options
		says string
	}{
		{"user without evalsha", goredis.Options{Addr: s.Addr(), Username: "noevalsha", Password: "pw"}, "NOPERM"},
		{"user without the keys", goredis.Options{Addr: s.Addr(), Username: "nokeys", Password: "pw"}, "NOPERM"},
		{"user without the scripts' commands", goredis.Options{Addr: s.Addr(), Username: "scriptsonly", Password: "pw"}, "script"},
		{"evalsha renamed", goredis.Options{Addr: renamed.Addr()}, "unknown command"},
		{"time renamed", goredis.Options{Addr: noTime.Addr()}, "Unknown Redis command called from script"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := goredis.NewClient(&tc.opts)
			defer c.Close()
			l := newLocker(t, c)
			// The first attempt is refused, held lock or not.
			for _, kind := range []string{"plain", "fair", "read", "write", "semaphore"} {
				key := "refused/" + kind
				opts := driver.AcquireOptions{TTL: time.Minute, Wait: true, Fair: kind == "fair"}
				// The context's end is only there for the test to fail
				// rather than hang without the fix.
				wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				var lease driver.Lease
				var err error
				switch kind {
				case "read":
					lease, err = l.AcquireRead(wctx, key, opts)
				case "write":
					lease, err = l.AcquireWrite(wctx, key, opts)
				case "semaphore":
					lease, err = l.AcquireSemaphore(wctx, key, 1, opts)
				default:
					lease, err = l.Acquire(wctx, key, opts)
				}
				cancel()
				if lease != nil || !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("%s, waiting: got %v, want ErrUnavailable saying %s", kind, err, tc.says)
				}
			}
		})
	}
}

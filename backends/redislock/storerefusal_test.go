package redislock

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/failopen"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// TestStoreRefusedForGood: a Store whose server refuses its scripts
// whatever happens meanwhile (an ACL user without the store's keys,
// without EVALSHA, or without the commands the scripts call; EVALSHA
// renamed away) fails every call with the server's words wrapping
// idempotency.ErrInvalid, not ErrUnavailable, and httpmw's Idempotency
// with WithFailOpen answers a keyed request 500 without running its
// handler, where it served it unguarded, as for a store that is down. A
// wrong password stays ErrUnavailable: a credentials provider of
// short-lived tokens may mend it.
func TestStoreRefusedForGood(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	for user, rules := range map[string][]any{
		"nokeys":      {"~other:*", "&*", "+@all"},
		"noevalsha":   {"~*", "&*", "+@all", "-evalsha"},
		"scriptsonly": {"~*", "&*", "+evalsha", "+eval", "+evalsha_ro", "+eval_ro"},
	} {
		if err := admin.Do(ctx, append([]any{"acl", "setuser", user, "on", ">pw"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	renamed := drivertest.StartRedis(t, "--rename-command", "evalsha", "")
	for _, tc := range []struct {
		name string
		opts goredis.Options
		says string
		// Get runs its script by EVALSHA_RO, which these leave alone.
		reads bool
		// The server refused the script before running any of it, which
		// the changes sent once say (driver.ErrNotSent).
		notSent bool
	}{
		{"user without the store's keys", goredis.Options{Addr: s.Addr(), Username: "nokeys", Password: "pw"}, "NOPERM", false, true},
		{"user without evalsha", goredis.Options{Addr: s.Addr(), Username: "noevalsha", Password: "pw"}, "NOPERM", true, true},
		{"user without the scripts' commands", goredis.Options{Addr: s.Addr(), Username: "scriptsonly", Password: "pw"}, "script", false, false},
		{"evalsha renamed", goredis.Options{Addr: renamed.Addr()}, "unknown command", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := goredis.NewClient(&tc.opts)
			defer c.Close()
			st := newStore(t, c)
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, claimErr := st.Claim(cctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute})
			_, getErr := st.Get(cctx, "", "k")
			if tc.reads && !errors.Is(getErr, idempotency.ErrNotFound) {
				t.Errorf("Get: %v; want ErrNotFound, its script run by EVALSHA_RO", getErr)
			}
			for op, err := range map[string]error{
				"Claim": claimErr, "Get": getErr,
				"Extend":   st.Extend(cctx, "", "k", "o", time.Minute),
				"Complete": st.Complete(cctx, "", "k", "o", []byte("r"), time.Minute),
				"Abandon":  st.Abandon(cctx, "", "k", "o"),
				"Delete":   st.Delete(cctx, "", "k", "o"),
			} {
				if op == "Get" && tc.reads {
					continue
				}
				if !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("%s: %v; want ErrInvalid, not ErrUnavailable, saying %s", op, err, tc.says)
				}
				if once := op == "Complete" || op == "Abandon" || op == "Delete"; once && tc.notSent && !errors.Is(err, driver.ErrNotSent) {
					t.Errorf("%s: %v; want it marked not sent", op, err)
				}
			}
			if status, ran := failopen.Serve(t, st, true); ran != 0 || status != http.StatusInternalServerError {
				t.Errorf("Idempotency with WithFailOpen: status %d, handler run %d times; want 500 (not 503, which says retry later), the handler not run",
					status, ran)
			}
		})
	}
	t.Run("wrong password", func(t *testing.T) {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "nokeys", Password: "wrong"})
		defer c.Close()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := newStore(t, c).Claim(cctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute})
		if !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("Claim: %v; want ErrUnavailable saying WRONGPASS", err)
		}
	})
}

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

// TestRefusalEndsTheWait: when a majority of the masters refuse a request
// whatever happens meanwhile (an ACL user without EVALSHA there), a
// waiting acquisition ends at once with the servers' words, rather than
// wait out the caller's context and say only that it ended. A refusal by
// a minority leaves the lock to the others.
func TestRefusalEndsTheWait(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 3)
	for _, s := range servers {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		if err := c.Do(ctx, "acl", "setuser", "noevalsha", "on", ">pw", "~*", "&*", "+@all", "-evalsha").Err(); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	for _, refusing := range []int{1, 2, 3} {
		// The first nodes log in as the user without EVALSHA.
		n := 0
		l := privateLocker(t, servers, func(o *goredis.Options) {
			if n++; n <= refusing {
				o.Username, o.Password = "noevalsha", "pw"
			}
		}, WithNodeTimeout(time.Second))
		// The context's end is only there for the test to fail rather
		// than hang without the fix.
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		lease, err := l.Acquire(wctx, "k", driver.AcquireOptions{TTL: time.Minute, Wait: true})
		cancel()
		if refusing == 1 {
			if err != nil {
				t.Fatalf("one node of 3 refusing: %v", err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if lease != nil || !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%d nodes of 3 refusing, waiting: got %v, want ErrUnavailable saying NOPERM", refusing, err)
		}
	}
}

// TestRefusalInsideTheVoteWritesNothing: a node whose ACL user lacks a
// command the vote runs after writing it (PEXPIREAT, which sets the key's
// expiry once a day) refuses every vote alike. It refused the first, but
// kept the vote it had written, whose state says the expiry was set: the
// votes after it were granted, on a key that never expires.
func TestRefusalInsideTheVoteWritesNothing(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 3)
	for _, s := range servers {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		if err := c.Do(ctx, "acl", "setuser", "noexpire", "on", ">pw", "~{warden:*",
			"+evalsha", "+eval", "+get", "+set", "+del", "+time", "+pttl", "+info", "+ping").Err(); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	l := privateLocker(t, servers, func(o *goredis.Options) { o.Username, o.Password = "noexpire", "pw" }, WithNodeTimeout(time.Second))
	for i := range 3 {
		lease, err := l.Acquire(ctx, "warden:k", driver.AcquireOptions{TTL: time.Minute})
		if lease != nil {
			lease.Release(ctx)
		}
		if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "can't run this command") {
			t.Fatalf("acquisition %d without PEXPIREAT: got %v, want the nodes' refusal", i, err)
		}
	}
	admin := goredis.NewClient(&goredis.Options{Addr: servers[0].Addr()})
	defer admin.Close()
	if n := admin.Exists(ctx, "{warden:k}:lock").Val(); n != 0 {
		t.Errorf("the refused votes left their key (%q)", admin.Get(ctx, "{warden:k}:lock").Val())
	}
}

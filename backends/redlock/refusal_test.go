package redlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// setUser makes an ACL user name, password "pw", with rules on every
// server.
func setUser(t *testing.T, servers []*drivertest.RedisServer, name string, rules ...string) {
	t.Helper()
	args := []any{"acl", "setuser", name, "on", ">pw"}
	for _, r := range rules {
		args = append(args, r)
	}
	for _, s := range servers {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		err := c.Do(context.Background(), args...).Err()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRefusalEndsTheWait: when a majority of the masters refuse a request
// whatever happens meanwhile (an ACL user without EVALSHA there), a
// waiting acquisition ends at once with the servers' words, rather than
// wait out the caller's context and say only that it ended. A refusal by
// a minority leaves the lock to the others.
func TestRefusalEndsTheWait(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 3)
	setUser(t, servers, "noevalsha", "~*", "&*", "+@all", "-evalsha")
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
	setUser(t, servers, "noexpire", "~{warden:*", "+evalsha", "+eval", "+get", "+set", "+del", "+time", "+pttl", "+info", "+ping")
	l := privateLocker(t, servers, func(o *goredis.Options) { o.Username, o.Password = "noexpire", "pw" }, WithNodeTimeout(time.Second))
	for i := range 3 {
		lease, err := l.Acquire(ctx, "warden:k", driver.AcquireOptions{TTL: time.Minute})
		if lease != nil {
			lease.Release(ctx)
		}
		if !errors.Is(err, errRefused) || !scriptRefused(err) {
			t.Fatalf("acquisition %d without PEXPIREAT: got %v, want the nodes' refusal", i, err)
		}
	}
	admin := goredis.NewClient(&goredis.Options{Addr: servers[0].Addr()})
	defer admin.Close()
	if n := admin.Exists(ctx, "{warden:k}:lock").Val(); n != 0 {
		t.Errorf("the refused votes left their key (%q)", admin.Get(ctx, "{warden:k}:lock").Val())
	}
}

// TestRefusedProbeEndsTheWait: a waiter reads the nodes' states (GET)
// before it votes again. When a majority refuses that read for good (an
// ACL user without GET), the waiting acquisition ends at once with the
// servers' words, though the lock is still held. It probed until its
// context ended and said only that the context had ended: with every node
// refusing, after the lock was released; with a majority refusing, while
// the lock was held (the others were asked only when some of the first
// were free). A minority refusing leaves the lock to the others once it
// is released.
func TestRefusedProbeEndsTheWait(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 5)
	setUser(t, servers, "noget", "~{warden:*", "+evalsha", "+eval", "+set", "+del", "+time", "+pttl", "+pexpireat", "+info", "+ping")
	for _, c := range []struct{ nodes, refusing int }{{3, 3}, {3, 2}, {5, 3}, {5, 2}} {
		on := servers[:c.nodes]
		key := fmt.Sprintf("warden:%d-of-%d", c.refusing, c.nodes)
		holder := privateLocker(t, on, nil, WithNodeTimeout(time.Second))
		// The first nodes log in as the user without GET.
		n := 0
		waiter := privateLocker(t, on, func(o *goredis.Options) {
			if n++; n <= c.refusing {
				o.Username, o.Password = "noget", "pw"
			}
		}, WithNodeTimeout(time.Second))
		held, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		majority := c.refusing > c.nodes/2
		if !majority {
			time.AfterFunc(300*time.Millisecond, func() { held.Release(ctx) })
		}
		// The context's end is only there for the test to fail rather
		// than hang without the fix.
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lease, err := waiter.Acquire(wctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true})
		cancel()
		if !majority {
			if err != nil {
				t.Errorf("%d of %d nodes refusing the read: %v, want the lock once released", c.refusing, c.nodes, err)
			} else {
				lease.Release(ctx)
			}
			continue
		}
		held.Release(ctx)
		if lease != nil || !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%d of %d nodes refusing the read, the lock held: got %v, want the nodes' refusal (NOPERM)", c.refusing, c.nodes, err)
		}
	}
}

// scriptRefused reports whether err carries a refusal of a command called
// from inside a script, in Redis 7.0's words or 7.2's and Valkey's.
func scriptRefused(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "can't run this command") || strings.Contains(err.Error(), "ACL failure in script"))
}

// TestRefusalInsideTheRefreshWritesNothing: a refresh whose node refuses
// PEXPIREAT after writing the extended vote (an ACL without it; the key's
// day was set by a user with it) takes its write back. It kept the vote,
// with its new day, though the refresh failed: the next refresh, finding
// the day set, skipped PEXPIREAT and succeeded, and the keys expired with
// their old day, hours before the lease's Expiry.
func TestRefusalInsideTheRefreshWritesNothing(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 3)
	setUser(t, servers, "noexpire", "~{warden:*", "+evalsha", "+eval", "+get", "+set", "+del", "+time", "+pttl", "+info", "+ping")
	admin := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	first, err := admin.Acquire(ctx, "warden:k", driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := privateLocker(t, servers, func(o *goredis.Options) { o.Username, o.Password = "noexpire", "pw" }, WithNodeTimeout(time.Second))
	lease, err := l.Acquire(ctx, "warden:k", driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("acquisition on a key whose day is set: %v", err)
	}
	defer lease.Release(ctx)
	c := goredis.NewClient(&goredis.Options{Addr: servers[0].Addr()})
	defer c.Close()
	before := c.Get(ctx, "{warden:k}:lock").Val()
	// Two days on: the day moves, and PEXPIREAT is refused.
	for i := range 2 {
		err := lease.Refresh(ctx, 48*time.Hour)
		if !scriptRefused(err) {
			t.Fatalf("refresh %d to 48h without PEXPIREAT: got %v, want the nodes' refusal", i, err)
		}
		if after := c.Get(ctx, "{warden:k}:lock").Val(); after != before {
			t.Fatalf("refresh %d was refused but left %q where the vote was %q", i, after, before)
		}
	}
	if left, pttl := time.Until(lease.Expiry()), c.PTTL(ctx, "{warden:k}:lock").Val(); left > pttl {
		t.Errorf("the lease's Expiry is %v away, its key expires in %v", left, pttl)
	}
}

// TestLostKeyStaysLost: a refresh and a release on a node that lost the
// vote's key (restarted empty, deleted by hand) leave no key there. They
// wrote their state, then took it back with a DEL, which a user without
// DEL was refused: the key stayed, with no expiry.
func TestLostKeyStaysLost(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 3)
	setUser(t, servers, "nodel", "~{warden:*", "+evalsha", "+eval", "+get", "+set", "+time", "+pttl", "+pexpireat", "+info", "+ping")
	l := privateLocker(t, servers, func(o *goredis.Options) { o.Username, o.Password = "nodel", "pw" }, WithNodeTimeout(time.Second))
	lease, err := l.Acquire(ctx, "warden:k", driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewClient(&goredis.Options{Addr: servers[0].Addr()})
	defer c.Close()
	// Refresh and Release return on a majority's answers, which node 0's
	// may not be among: the check waits until node 0 ran the script. A
	// script not loaded there yet is refused (NOSCRIPT) and sent again.
	scripts := func() int {
		info := c.Info(ctx, "commandstats", "errorstats").Val()
		stat := func(prefix string) int {
			_, rest, _ := strings.Cut(info, prefix)
			n, _ := strconv.Atoi(strings.TrimRight(rest[:strings.IndexAny(rest+",\r", ",\r")], "\r"))
			return n
		}
		return stat("cmdstat_evalsha:calls=") + stat("cmdstat_eval:calls=") - stat("errorstat_NOSCRIPT:count=")
	}
	lost := func(what string, before int, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s, held on 2 of 3 nodes: %v", what, err)
		}
		for deadline := time.Now().Add(10 * time.Second); scripts() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: node 0 ran no script within 10s", what)
			}
		}
		if n := c.Exists(ctx, "{warden:k}:lock").Val(); n != 0 {
			t.Errorf("%s left a key where it was lost: %q, pttl %v", what, c.Get(ctx, "{warden:k}:lock").Val(), c.PTTL(ctx, "{warden:k}:lock").Val())
			c.Del(ctx, "{warden:k}:lock")
		}
	}
	c.Del(ctx, "{warden:k}:lock")
	before := scripts()
	lost("the refresh", before, lease.Refresh(ctx, time.Minute))
	before = scripts()
	lost("the release", before, lease.Release(ctx))
}

package redlock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// respell names the server at addr (127.0.0.1:port) by another spelling.
func respell(t *testing.T, addr, host string) string {
	t.Helper()
	rest, ok := strings.CutPrefix(addr, "127.0.0.1:")
	if !ok {
		t.Skipf("%s is not on 127.0.0.1", addr)
	}
	return host + ":" + rest
}

// TestOneServerUnderTwoAddresses: a server listed under two spellings of
// its address (localhost, an IPv4-mapped IPv6 address) would count twice
// toward a majority: with the third node down, a lock granted by one
// server; beside a Locker on three servers, a lock held twice. New cannot
// tell without a request; the acquisition and Ping refuse it with
// ErrInvalidOption naming both addresses, and write no vote that stays.
func TestOneServerUnderTwoAddresses(t *testing.T) {
	addrs := strings.Split(drivertest.Addr(t, addrsEnv, addrsDefault), ",")
	ctx := context.Background()
	for _, host := range []string{"127.0.0.1", "localhost", "[::ffff:127.0.0.1]"} {
		alias := respell(t, addrs[0], host)
		for name, nodes := range map[string][]string{
			"third down":   {addrs[0], alias, drivertest.ClosedAddr(t)},
			"third up":     {addrs[0], alias, addrs[1]},
			"aliases last": {addrs[1], addrs[0], alias},
		} {
			l, err := New(clients(t, nodes, nil), WithNodeTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			key := "alias/" + host + "/" + name
			lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second})
			if lease != nil {
				lease.Release(ctx)
			}
			if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), addrs[0]) || !strings.Contains(err.Error(), alias) {
				t.Errorf("%s, %s: Acquire got %v, want ErrInvalidOption naming %s and %s", host, name, err, addrs[0], alias)
			}
			if err := l.Ping(ctx); !errors.Is(err, driver.ErrInvalidOption) {
				t.Errorf("%s, %s: Ping got %v, want ErrInvalidOption", host, name, err)
			}
			// Nothing was written: a Locker on three servers takes the key.
			other := sharedLocker(t)
			held, err := other.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second})
			if err != nil {
				t.Fatalf("%s, %s: a Locker on distinct servers: %v", host, name, err)
			}
			held.Release(ctx)
		}
	}
}

// TestOneServerUnderOtherTransports: a server reached over its unix
// socket beside its TCP address, or over ::1 beside 127.0.0.1, is one
// server whatever the transport: the acquisition is refused with
// ErrInvalidOption naming both, as for two spellings of a host name.
func TestOneServerUnderOtherTransports(t *testing.T) {
	ctx := context.Background()
	sock := t.TempDir() + "/redis.sock"
	// ::1 is bound only where the machine has it ('-': a missing address
	// is skipped).
	s := drivertest.StartRedis(t, "--unixsocket", sock, "--bind", "127.0.0.1", "-::1")
	other := drivertest.StartRedis(t)
	_, port, _ := net.SplitHostPort(s.Addr())
	v6 := "[::1]:" + port
	unix := goredis.NewClient(&goredis.Options{Network: "unix", Addr: sock, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { unix.Close() })
	tcp := clients(t, []string{s.Addr(), other.Addr(), v6}, nil)
	cases := map[string]goredis.UniversalClient{sock: unix}
	if err := tcp[2].Ping(ctx).Err(); err == nil {
		cases[v6] = tcp[2]
	} else {
		t.Logf("no ::1 here (%v): only the unix socket is tried", err)
	}
	for alias, c := range cases {
		l, err := New([]goredis.UniversalClient{tcp[0], c, tcp[1]}, WithNodeTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		lease, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: 10 * time.Second})
		if lease != nil {
			lease.Release(ctx)
		}
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), s.Addr()) || !strings.Contains(err.Error(), alias) {
			t.Errorf("%s beside %s: Acquire got %v, want ErrInvalidOption naming both", alias, s.Addr(), err)
		}
	}
}

// TestAliasesStayOneServerAfterRestart: a server restarted has a new
// run_id; two nodes naming it under two addresses are refused before the
// restart and after it alike, and distinct nodes, one restarted, still
// grant the lock.
func TestAliasesStayOneServerAfterRestart(t *testing.T) {
	servers := startServers(t, 3)
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 10 * time.Second}
	a := servers[0].Addr()
	aliased, err := New(clients(t, []string{a, respell(t, a, "localhost"), servers[1].Addr()}, nil), WithNodeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	distinct := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	if _, err := aliased.Acquire(ctx, "k", opts); !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("before the restart: %v, want ErrInvalidOption", err)
	}
	lease, err := distinct.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	servers[0].Restart(t)
	// As once the identities read before the restart are too old.
	aliased.ids.Store(nil)
	distinct.ids.Store(nil)
	if _, err := aliased.Acquire(ctx, "k", opts); !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("after the restart: %v, want ErrInvalidOption", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		lease, err := distinct.Acquire(ctx, "k", opts)
		if err == nil {
			lease.Release(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("distinct nodes, one restarted: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestACLNeedsInfo: a node is told apart from the others by its INFO
// run_id, so an ACL user without INFO is refused there for good: a
// majority of such nodes ends an acquisition at once with NOPERM, waiting
// or not. The user doc.go documents takes the lock.
func TestACLNeedsInfo(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 3)
	for _, s := range servers {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		for _, rules := range [][]any{
			{"noinfo", "on", ">pw", "~*", "&*", "+@all", "-info"},
			{"warden", "on", ">pw", "~{warden:*", "+evalsha", "+eval", "+get", "+set", "+del", "+time", "+pttl", "+pexpireat", "+info", "+ping"},
		} {
			if err := c.Do(ctx, append([]any{"acl", "setuser"}, rules...)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	login := func(user string) func(*goredis.Options) {
		return func(o *goredis.Options) { o.Username, o.Password = user, "pw" }
	}
	noInfo := privateLocker(t, servers, login("noinfo"), WithNodeTimeout(time.Second))
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	lease, err := noInfo.Acquire(wctx, "warden:k", driver.AcquireOptions{TTL: time.Minute, Wait: true})
	cancel()
	if lease != nil || !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("without INFO, waiting: got %v, want ErrUnavailable saying NOPERM", err)
	}
	// Nothing can be granted so: Ping says so, not healthy.
	if err := noInfo.Ping(ctx); !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("without INFO, Ping: got %v, want ErrUnavailable saying NOPERM", err)
	}
	l := privateLocker(t, servers, login("warden"), WithNodeTimeout(time.Second))
	lease, err = l.Acquire(ctx, "warden:k", driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("the documented ACL user: %v", err)
	}
	if err := lease.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestUnknownServerDoesNotCount: a node whose run_id is unknown (its ACL
// user lacks INFO) may be another node's server under a second address,
// so neither its vote nor its refreshes count: with the only other server
// down, a refresh counted on one server twice would keep a lock that a
// Locker on distinct servers can take.
func TestUnknownServerDoesNotCount(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 2)
	a := servers[0].Addr()
	l := firstWithoutInfo(t, servers[0], a, respell(t, a, "localhost"), servers[1].Addr())
	lease, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("two known servers of three nodes: %v", err)
	}
	servers[1].Kill(t)
	if err := lease.Refresh(ctx, 10*time.Second); err == nil {
		t.Error("refreshed with one server up, counted twice")
	}
}

// TestRefreshAfterFailoverOntoAnotherNode: node 0's address fails over
// onto node 2's server (a virtual address moved to the wrong server), and
// the other two servers die. Once the identities are read again, a lease
// taken before is not renewed on that one server counted twice: it renewed
// for as long as it lived. (The read is forced here; it comes within a
// minute, see identityReuse.)
func TestRefreshAfterFailoverOntoAnotherNode(t *testing.T) {
	s := startServers(t, 3)
	var target atomic.Value
	target.Store(s[0].Addr())
	n0 := goredis.NewClient(&goredis.Options{
		Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", target.Load().(string))
		},
		MaxRetries: -1, ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { n0.Close() })
	rest := clients(t, []string{s[1].Addr(), s[2].Addr()}, nil)
	l, err := New([]goredis.UniversalClient{n0, rest[0], rest[1]}, WithNodeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 10 * time.Second}
	held, err := l.Acquire(ctx, "held", opts)
	if err != nil {
		t.Fatal(err)
	}
	target.Store(s[2].Addr())
	s[0].Kill(t)
	s[1].Kill(t)
	l.ids.Store(nil)
	if err := held.Refresh(ctx, opts.TTL); !errors.Is(err, driver.ErrNotHeld) || !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("refresh with node 0 failed over onto node 2's server, the others down: %v, want ErrNotHeld naming one server", err)
	}
}

// TestRefreshReadsNoIncompleteIdentities: while a node's server is unknown
// (its user lacks INFO here; a node that does not answer alike), an
// acquisition reads the identities again every second, but a refresh does
// not: it would wait the node timeout for a node that does not answer,
// every second, and a lease renewed late is lost. It reads them once they
// are identityReuse old.
func TestRefreshReadsNoIncompleteIdentities(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 3)
	l := firstWithoutInfo(t, servers[0], servers[0].Addr(), servers[1].Addr(), servers[2].Addr())
	lease, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ids := l.ids.Load()
	if ids == nil || ids.ids[0] != "" {
		t.Fatalf("node 0's server known (%v), want unknown", ids)
	}
	// Due to be read again by an acquisition, not by a refresh.
	ids.until = time.Now()
	if err := lease.Refresh(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if l.ids.Load() != ids {
		t.Error("a refresh read the identities again while one was unknown")
	}
	// Once they are identityReuse old, it reads them.
	ids.read = time.Now().Add(-identityReuse)
	if err := lease.Refresh(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if l.ids.Load() == ids {
		t.Error("a refresh did not read identities identityReuse old")
	}
}

// firstWithoutInfo returns a Locker on addrs whose first node logs in to
// first, its server, as a user without INFO, so that its server is unknown.
func firstWithoutInfo(t *testing.T, first *drivertest.RedisServer, addrs ...string) *Locker {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: first.Addr()})
	defer c.Close()
	if err := c.Do(context.Background(), "acl", "setuser", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	n := 0
	l, err := New(clients(t, addrs, func(o *goredis.Options) {
		if n++; n == 1 {
			o.Username, o.Password = "noinfo", "pw"
		}
	}), WithNodeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

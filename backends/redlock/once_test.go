package redlock

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

// TestReleaseSentOnce: a withdrawal whose answer is lost with its
// connection, on clients with go-redis's default retries, is not sent
// again: sent again, it found the vote withdrawn by the first and answered
// that it was not held, and a majority of such answers made the release
// ErrNotHeld, which guard takes for a lock lost during the section. It
// fails as unavailable, the lock released all the same.
func TestReleaseSentOnce(t *testing.T) {
	ctx := context.Background()
	servers := startServers(t, 3)
	proxies := make([]*drivertest.Proxy, len(servers))
	nodes := make([]goredis.UniversalClient, len(servers))
	direct := make([]*goredis.Client, len(servers))
	for i, s := range servers {
		proxies[i] = drivertest.StartProxy(t, s.Addr())
		c := goredis.NewClient(&goredis.Options{Addr: proxies[i].Addr()})
		direct[i] = goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		for _, c := range []*goredis.Client{c, direct[i]} {
			t.Cleanup(func() { c.Close() })
		}
		nodes[i] = c
	}
	l, err := New(nodes, WithNodeTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// A cycle first, so that the scripts are loaded, and connections that
	// have said hello: the withdrawals go out at once, where a new
	// connection would wait for the late answer to its HELLO.
	var held driver.Lease
	for range 2 {
		if held != nil {
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			awaitWithdrawn(t, l, "k")
		}
		if held, err = l.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range nodes {
		warm(t, c.(*goredis.Client), 2)
	}
	// The answers are lost; once every node has run the withdrawal, the
	// connections are reset, and a withdrawal sent again would be
	// answered.
	for _, p := range proxies {
		p.LoseReplies()
		defer p.Reset()
	}
	done := make(chan error, 1)
	go func() { done <- held.Release(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for _, c := range direct {
		for !strings.HasPrefix(c.Get(ctx, lockKeyOf("k")).Val(), "0:") {
			if time.Now().After(deadline) {
				t.Fatal("the nodes never ran the withdrawal")
			}
			time.Sleep(time.Millisecond)
		}
	}
	for _, p := range proxies {
		p.Reset()
	}
	if err := <-done; errors.Is(err, driver.ErrNotHeld) || !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("release answered late: got %v, want ErrUnavailable", err)
	}
}

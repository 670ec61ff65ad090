//go:build unix

package drivertest_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestRedisServerFaults: the faults the tests that use a RedisServer rely
// on are the ones they get. Frozen, it leaves a request unanswered; thawed,
// it answers again; restarted, it is at the same address and has lost its
// data, even as a replica that had written what it received to disk (or the
// tests of tokens after lost data would pass without losing any); killed,
// it refuses connections.
func TestRedisServerFaults(t *testing.T) {
	ctx := context.Background()
	client := func(s *drivertest.RedisServer) *goredis.Client {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	// A replica is sent its primary's data at once, not after 5 s.
	s := drivertest.StartRedis(t, "--repl-diskless-sync-delay", "0")
	c := client(s)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Signal(t, syscall.SIGSTOP)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := c.Ping(short).Err()
	cancel()
	if err == nil {
		t.Fatal("a frozen server answered PING")
	}
	s.Signal(t, syscall.SIGCONT)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING once thawed: %v", err)
	}

	addr := s.Addr()
	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("restarted at %s, not %s", s.Addr(), addr)
	}
	c = client(s)
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, goredis.Nil) {
		t.Fatalf("GET of the key on the restarted server: %v, want nothing", err)
	}

	// A replica keeps on disk the data its primary sent it when it began;
	// the primary gone, it would load it again at a restart in the same
	// directory.
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(s.Addr())
	replica := drivertest.StartRedis(t, "--replicaof", host, port)
	rc := client(replica)
	for deadline := time.Now().Add(15 * time.Second); rc.Get(ctx, "k").Val() != "v"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replica never got the key")
		}
	}
	s.Kill(t)
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("a killed server accepted a connection")
	}
	replica.Restart(t)
	if err := client(replica).Get(ctx, "k").Err(); !errors.Is(err, goredis.Nil) {
		t.Fatalf("GET of the key on the restarted replica: %v, want nothing", err)
	}
}

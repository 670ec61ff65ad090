package redislock

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// privateServer runs a redis-server of this test's own, without
// persistence, on port (a free one when 0); extra are more arguments.
func privateServer(t *testing.T, port int, extra ...string) (addr string, kill func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		drivertest.Unreachable(t, "redis-server binary", "$PATH", err)
	}
	if port == 0 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--loglevel", "warning", "--dir", t.TempDir()}, extra...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	kill = func() {
		cmd.Process.Kill()
		<-done
	}
	t.Cleanup(kill)
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr, kill
}

// grant takes and releases key on addr, returning the token.
func grant(t *testing.T, addr, key string) uint64 {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	l := newLocker(t, c)
	lease, err := l.Acquire(context.Background(), key, driver.AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	return lease.Token()
}

// TestTokensGrowAcrossLostFences: the fence counter lives in Redis and is
// lost with the data, by a restart without persistence or by a failover to
// a replica that missed the latest grants; the tokens issued afterwards
// must still be greater than every token issued before.
func TestTokensGrowAcrossLostFences(t *testing.T) {
	t.Run("restart without persistence", func(t *testing.T) {
		addr, kill := privateServer(t, 0)
		var last uint64
		for range 5 {
			last = grant(t, addr, "k")
		}
		kill()
		_, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		addr, _ = privateServer(t, p)
		if next := grant(t, addr, "k"); next <= last {
			t.Fatalf("token %d after the restart, not greater than %d before it", next, last)
		}
	})
	t.Run("failover to a lagging replica", func(t *testing.T) {
		primary, _ := privateServer(t, 0)
		host, port, _ := net.SplitHostPort(primary)
		replica, _ := privateServer(t, 0, "--replicaof", host, port)
		grant(t, primary, "k")
		rc := goredis.NewClient(&goredis.Options{Addr: replica})
		defer rc.Close()
		ctx := context.Background()
		deadline := time.Now().Add(15 * time.Second)
		for rc.Exists(ctx, "{k}:fence").Val() != 1 {
			if time.Now().After(deadline) {
				t.Fatal("the replica never got the fence")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// The replica is cut off, then the primary grants more: the replica
		// that is promoted next has missed them, as after an asynchronous
		// failover.
		if err := rc.ReplicaOf(ctx, "no", "one").Err(); err != nil {
			t.Fatal(err)
		}
		var last uint64
		for range 5 {
			last = grant(t, primary, "k")
		}
		if next := grant(t, replica, "k"); next <= last {
			t.Fatalf("token %d on the promoted replica, not greater than %d granted before the failover", next, last)
		}
	})
}

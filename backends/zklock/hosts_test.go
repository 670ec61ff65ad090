package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestHostsOrder walks the provider through failed attempts: untried
// servers first, a server that timed out passed over for those that failed
// fast, a round reported once every attempt of it failed, and the client
// library's pause asked for only once the Locker is closed.
func TestHostsOrder(t *testing.T) {
	quit := make(chan struct{})
	// A long session timeout, so that a timed-out server's pause (10s)
	// outlasts any stall of the test between two calls.
	h := newHosts(quit, time.Minute)
	if err := h.Init([]string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		s, retryStart := h.Next()
		if retryStart {
			t.Fatal("Next asked for the client library's pause before the Locker was closed")
		}
		return s
	}
	up, round := h.link()
	slow := next()
	h.slow()
	seen := map[string]bool{slow: true}
	for range 2 {
		s := next()
		if seen[s] {
			t.Fatalf("%s tried again before an untried server", s)
		}
		seen[s] = true
	}
	if closed(round) {
		t.Fatal("round reported failed after two failed attempts of three")
	}
	if s := next(); s == slow {
		t.Fatalf("%s, which timed out, tried again before the servers that failed fast", s)
	}
	if !closed(round) {
		t.Fatal("round not reported failed after three failed attempts")
	}
	if closed(up) {
		t.Fatal("link up without a session")
	}
	h.Connected()
	if up, _ = h.link(); !closed(up) {
		t.Fatal("link not up once connected")
	}
	h.down()
	if up, _ = h.link(); closed(up) {
		t.Fatal("link still up once the connection ended")
	}
	close(quit)
	if _, retryStart := h.Next(); !retryStart {
		t.Fatal("Next did not ask for the client library's pause once the Locker was closed")
	}
	if h.wait() {
		t.Fatal("wait let an attempt go once the Locker was closed")
	}
}

// TestUnreachableFailsAfterRound: with no server to connect to, requests
// fail as soon as a round of attempts has failed, not at the request
// timeout (an hour here) or the caller's deadline.
func TestUnreachableFailsAfterRound(t *testing.T) {
	l := dial(t, []string{deadAddr(t), deadAddr(t)}, WithRequestTimeout(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.Ping(ctx); !errors.Is(err, driver.ErrUnavailable) || !errors.Is(err, zk.ErrNoServer) {
		t.Errorf("Ping: %v, want ErrUnavailable wrapping zk.ErrNoServer", err)
	}
	if _, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: testSession}); !errors.Is(err, driver.ErrUnavailable) || !errors.Is(err, zk.ErrNoServer) {
		t.Errorf("Acquire: %v, want ErrUnavailable wrapping zk.ErrNoServer", err)
	}
}

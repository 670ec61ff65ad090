package zklock

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestTTLOverGrantedSession: a Locker that asked for a longer session than
// the server grants (its maxSessionTimeout) refuses a TTL over twice the
// granted timeout with ErrInvalidOption and leaves no node queued: guard's
// margin, a tenth of the TTL, would exceed what the session can vouch for,
// and every lock would be lost as soon as it was granted. A TTL within
// twice the granted timeout is held, its session kept by heartbeats timed
// by the granted timeout.
func TestTTLOverGrantedSession(t *testing.T) {
	s := startServerUpTo(t, 3*time.Second)
	l := dial(t, []string{s.addr}, WithSessionTimeout(10*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A JVM just started may turn the first connection away.
	eventually(t, "the server answers", func() bool { return l.Ping(ctx) == nil })
	k := testKey(t)
	for range 2 { // before the session is known, and after
		lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: 10 * time.Minute})
		if err == nil {
			lease.Release(ctx)
			t.Fatalf("acquired with a TTL of 10m on a session of %v", l.sessionTimeout())
		}
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Fatalf("TTL of 10m on a session of %v: %v, want ErrInvalidOption", l.sessionTimeout(), err)
		}
		// The error says what to do: lower the TTL, or raise the server's
		// limit.
		for _, remedy := range []string{"lower the ttl to at most " + (2 * l.sessionTimeout()).String(), "raise the server's maxSessionTimeout to at least 5m0s"} {
			if !strings.Contains(err.Error(), remedy) {
				t.Fatalf("TTL of 10m on a session of %v: %v, want an error that says to %s", l.sessionTimeout(), err, remedy)
			}
		}
		eventually(t, "the refused contender's node is gone", func() bool { return len(children(t, l, k)) == 0 })
	}
	g, err := guard.New(l, guard.WithTTL(2*l.sessionTimeout()))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := g.Lock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	// Heartbeats, a sixth of the session timeout apart, move the session's
	// expiry; without them guard would take the lease for lost two thirds
	// of the session timeout, less its margin, after the grant.
	eventually(t, "heartbeats past the session's first expiry", func() bool { return l.heartbeats.Load() >= 6 })
	if err := context.Cause(lk.Context()); err != nil {
		t.Fatalf("a lock with a TTL of twice the granted session timeout was lost: %v", err)
	}
}

// TestSessionTimeoutBounds: a session timeout the client library cannot
// send (it counts milliseconds in 32 bits) is refused by New, and the
// largest it can send keeps Limits positive.
func TestSessionTimeoutBounds(t *testing.T) {
	if _, err := New([]string{"127.0.0.1:1"}, WithSessionTimeout(math.MaxInt64), WithLogger(discard{})); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("New with a session timeout of MaxInt64: %v, want ErrInvalidOption", err)
	}
	l, err := New([]string{"127.0.0.1:1"}, WithSessionTimeout(math.MaxInt32*time.Millisecond), WithLogger(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Limits().MaxTTL; got <= 0 {
		t.Errorf("Limits().MaxTTL = %v", got)
	}
}

// TestDefaultRequestTimeoutIsGranted: without WithRequestTimeout, a request
// is bounded by the session timeout the server granted, not the longer one
// asked for: a server that acts on requests but whose answers are lost
// fails a call with driver.ErrUnavailable once the session has had its
// time, not when the caller's context ends.
func TestDefaultRequestTimeoutIsGranted(t *testing.T) {
	s := startServerUpTo(t, 3*time.Second)
	p := drivertest.StartProxy(t, s.addr)
	l := dial(t, []string{p.Addr()}, WithSessionTimeout(10*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A JVM just started may turn the first connection away.
	eventually(t, "the server answers", func() bool { return l.Ping(ctx) == nil })
	p.LoseReplies()
	start := time.Now()
	_, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: testSession})
	if ctx.Err() != nil || !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Acquire with its answers lost: %v (context: %v), want ErrUnavailable before the context ended", err, ctx.Err())
	}
	t.Logf("failed after %v with a %v session: %v", time.Since(start), l.sessionTimeout(), err)
}

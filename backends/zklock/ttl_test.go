package zklock

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// TestTTLOverGrantedSession: a Locker that asked for a longer session than
// the server grants (the test server's maxSessionTimeout is a minute)
// refuses a TTL over twice the granted timeout with ErrInvalidOption and
// leaves no node queued: guard's margin, a tenth of the TTL, would exceed
// what the session can vouch for, and every lock would be lost as soon as
// it was granted. A TTL within twice the granted timeout is held.
func TestTTLOverGrantedSession(t *testing.T) {
	srv := servers(t)
	l := dial(t, srv, WithSessionTimeout(10*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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
	// The first heartbeat, a sixth of the session timeout after the grant,
	// moves the session's expiry; a lease guard judged lost at its grant
	// would have been cancelled before it.
	eventually(t, "a heartbeat", func() bool { return l.heartbeats.Load() > 0 })
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

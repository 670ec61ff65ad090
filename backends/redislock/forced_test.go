package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/internal/forcedtest"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// TestForcedCause: a holder under guard.Do whose lock ForceRelease takes
// reads that in its section's cause, not an expiry, whether it finds the
// free state the operator left or, taken since by another, a later token
// before its own deadline; for a plain and a fair lock.
func TestForcedCause(t *testing.T) {
	for _, c := range []struct {
		name  string
		taken bool
		opts  []guard.LockOption
	}{
		{"plain", false, nil},
		{"plain-taken", true, nil},
		{"fair", false, []guard.LockOption{guard.Fair()}},
		{"fair-taken", true, []guard.LockOption{guard.Fair()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var taker driver.Locker
			if c.taken {
				taker = newLocker(t, newClient(t))
			}
			name := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
			cause := forcedtest.Cause(t, newLocker(t, newClient(t)), taker, name, 3*time.Second, c.opts...)
			if !errors.Is(cause, guard.ErrLockLost) || !strings.Contains(cause.Error(), "by ForceRelease") {
				t.Errorf("cause %v, want ErrLockLost naming ForceRelease", cause)
			}
		})
	}
}

// TestExpiredCause: a holder under guard.Do whose lease ends on the
// server's clock before it ends on its own (its state's deadline moved into
// the past, as a server clock stepped forward would) reads an expiry in its
// section's cause, and no ForceRelease.
func TestExpiredCause(t *testing.T) {
	admin := newClient(t)
	name := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	key := lockKeyOf(forcedtest.Prefix + name)
	cause := forcedtest.Lost(t, newLocker(t, newClient(t)), name, 3*time.Second, func(ctx context.Context, _ *guard.Guard) {
		// The deadline is the state's first field, in ms since the epoch.
		const past = `local v = redis.call('get', KEYS[1])
redis.call('set', KEYS[1], '1' .. string.sub(v, (string.find(v, ':', 1, true))), 'KEEPTTL')
return 1`
		if err := admin.Eval(ctx, past, []string{key}).Err(); err != nil {
			t.Fatal(err)
		}
	})
	if !errors.Is(cause, guard.ErrLockLost) || !strings.Contains(cause.Error(), "expired (nobody took it since)") || strings.Contains(cause.Error(), "ForceRelease") {
		t.Errorf("cause %v, want ErrLockLost saying it expired, and no ForceRelease", cause)
	}
}

// TestNotHeldWhy: refused renewals and releases say why, as the lock's
// state tells (see forcedtest.Reasons): the renewals from refresh_lock.lua's
// and refresh_locks.lua's letters, the release from the state read after
// release.lua's refusal.
func TestNotHeldWhy(t *testing.T) {
	name := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	forcedtest.Reasons(t, newLocker(t, newClient(t)), newLocker(t, newClient(t)), name)
}

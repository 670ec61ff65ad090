// Package forcedtest finds, on a backend's real server, what the holder of a
// lock that an operator took away with ForceRelease reads as the cause of
// its section's context. guard cancels the section with the backend's
// refusal of the next renewal as that cause, and an operator's release that
// read as an expiry would send whoever reads the holder's log after a clock
// or a network fault that was not there.
package forcedtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// Prefix is the guard prefix of the keys Lost and Cause hold: a key's
// name on the backend is Prefix and the key.
const Prefix = "forcedtest:"

// Lost holds key under guard.Do on holder, with a TTL of ttl and opts,
// until the section's context ends; runs end once the section runs, which
// must end the holding on the server; and returns the cause the section's
// context ended with.
func Lost(t *testing.T, holder driver.Locker, key string, ttl time.Duration, end func(ctx context.Context, g *guard.Guard), opts ...guard.LockOption) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := newGuard(t, holder, ttl)
	held := make(chan struct{})
	cause := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- g.Do(ctx, key, func(ctx context.Context, _ *guard.Lock) error {
			close(held)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return nil
		}, opts...)
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the holder's Do: %v", err)
	}
	end(ctx, g)
	var c error
	select {
	case c = <-cause:
	case <-ctx.Done():
		t.Fatal("the holder's section went on for a minute after its holding ended")
	}
	<-done
	return c
}

// Cause is Lost whose end takes the lock away with the holder's
// Guard.ForceRelease. With a taker, a Guard on it takes the lock as soon as
// it is free (before the holder's next renewal, unless that one runs
// first), and holds it until the holder's section ends, so that the holder
// finds a later holder's lock rather than what the operator left.
func Cause(t *testing.T, holder, taker driver.Locker, key string, ttl time.Duration, opts ...guard.LockOption) error {
	t.Helper()
	var taken *guard.Lock
	cause := Lost(t, holder, key, ttl, func(ctx context.Context, g *guard.Guard) {
		if _, err := g.ForceRelease(ctx, key, guard.ReleaseTarget{AnyHolder: true}); err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		if taker == nil {
			return
		}
		var err error
		if taken, err = newGuard(t, taker, ttl).TryLock(ctx, key, opts...); err != nil {
			t.Fatalf("the taker's TryLock after ForceRelease: %v", err)
		}
	}, opts...)
	if taken != nil {
		if err := taken.Unlock(context.Background()); err != nil {
			t.Errorf("the taker's Unlock: %v", err)
		}
	}
	return cause
}

func newGuard(t *testing.T, l driver.Locker, ttl time.Duration) *guard.Guard {
	t.Helper()
	g, err := guard.New(l, guard.WithTTL(ttl), guard.WithPrefix(Prefix))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Reasons checks what the renewals and releases of leases of l on key say
// once refused, as far as the lock's state tells: ForceRelease took the
// lease (a renewal one at a time and in a batch, and a release); it expired
// and nobody took it; it expired and another holder (of other) took it; it
// was released already. None of them but the first names ForceRelease. l
// must be a driver.Inspector, a driver.ForceReleaser and a
// driver.BatchRefresher, whose leases are at least 10 seconds long.
func Reasons(t *testing.T, l, other driver.Locker, key string) {
	t.Helper()
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 10 * time.Second}
	want := func(what string, err error, says string) {
		t.Helper()
		if !errors.Is(err, driver.ErrNotHeld) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want ErrNotHeld saying %q", what, err, says)
		}
		if says != "by ForceRelease" && strings.Contains(err.Error(), "ForceRelease") {
			t.Errorf("%s: %v names ForceRelease", what, err)
		}
	}
	acquire := func(l driver.Locker, opts driver.AcquireOptions) driver.Lease {
		t.Helper()
		le, err := l.Acquire(ctx, key, opts)
		if err != nil {
			t.Fatal(err)
		}
		return le
	}
	batch := func(le driver.Lease) error {
		return l.(driver.BatchRefresher).RefreshBatch(ctx, []driver.Lease{le}, opts.TTL)[0]
	}

	forced := acquire(l, opts)
	if _, err := l.(driver.ForceReleaser).ForceRelease(ctx, key, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	want("Refresh after ForceRelease", forced.Refresh(ctx, opts.TTL), "by ForceRelease")
	want("RefreshBatch after ForceRelease", batch(forced), "by ForceRelease")
	want("Release after ForceRelease", forced.Release(ctx), "by ForceRelease")

	ran := acquire(l, driver.AcquireOptions{TTL: 200 * time.Millisecond})
	deadline := time.Now().Add(20 * time.Second)
	for {
		in, err := l.(driver.Inspector).Inspect(ctx, key)
		if err == nil && len(in.Holders) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease did not run out in 20s: %+v, %v", in, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	want("Refresh after the TTL", ran.Refresh(ctx, opts.TTL), "expired (nobody took it since)")
	want("RefreshBatch after the TTL", batch(ran), "expired (nobody took it since)")

	taken := acquire(other, opts)
	want("Refresh after the TTL and another's grant", ran.Refresh(ctx, opts.TTL), "expired, and another holder took it")
	want("Release after the TTL and another's grant", ran.Release(ctx), "expired, and another holder took it")
	if err := taken.Release(ctx); err != nil {
		t.Fatal(err)
	}

	twice := acquire(l, opts)
	if err := twice.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want("Refresh after Release", twice.Refresh(ctx, opts.TTL), "released already")
	want("a second Release", twice.Release(ctx), "released already")
}

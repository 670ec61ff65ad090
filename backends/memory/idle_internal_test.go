package memory

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestIdleEntriesBounded: released keys stay in the table for reuse, but
// no more than maxIdle of them, and a key reused from there is held and
// released as any other.
func TestIdleEntriesBounded(t *testing.T) {
	ctx := context.Background()
	l := New()
	o := driver.AcquireOptions{TTL: time.Minute}
	for i := range 10 * maxIdle {
		lease, err := l.Acquire(ctx, fmt.Sprintf("k%d", i), o)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(l.entries); n > maxIdle {
		t.Fatalf("%d entries kept after every key was released, want at most %d", n, maxIdle)
	}
	key := fmt.Sprintf("k%d", 10*maxIdle-1) // released last: still in the table
	first, err := l.Acquire(ctx, key, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, key, o); err != driver.ErrNotAcquired {
		t.Fatalf("second acquisition of a held key: %v, want ErrNotAcquired", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err == nil {
		t.Fatal("a lease released twice was released again")
	}
}

// TestWaiterWokenAtExpiryAfterHandoffs: after a handoff, the timer set for
// an earlier holder's expiry is kept rather than reset; it must still lead
// to a waiter being granted the lock when the holder that vanished expires,
// neither sooner nor much later.
func TestWaiterWokenAtExpiryAfterHandoffs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := New()
		a, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 2)
		wait := func(ttl time.Duration) {
			if _, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: ttl, Wait: true}); err != nil {
				t.Error(err)
			}
			got <- time.Now()
		}
		start := time.Now()
		go wait(10 * time.Second) // b: granted when a releases, then vanishes
		synctest.Wait()
		go wait(time.Second) // c: waits for b's lease to run out
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if at := <-got; at.Sub(start) != 100*time.Millisecond {
			t.Fatalf("b granted after %v, want at a's release", at.Sub(start))
		}
		if at := <-got; at.Sub(start) != 100*time.Millisecond+10*time.Second {
			t.Fatalf("c granted after %v, want when b's lease expired (%v)", at.Sub(start), 100*time.Millisecond+10*time.Second)
		}
	})
}

// TestLeaseOfReusedEntry: a lease whose holding expired, and whose entry
// was then let go of and reused, for another key or for its own, neither
// renews nor releases anything, and leaves the entry's new holder alone.
func TestLeaseOfReusedEntry(t *testing.T) {
	for _, next := range []string{"z", "a"} {
		t.Run("reused for "+next, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				l := New()
				short := driver.AcquireOptions{TTL: time.Second}
				long := driver.AcquireOptions{TTL: time.Minute}
				a, err := l.Acquire(ctx, "a", short)
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Second)
				// The renewal finds the holding expired and lets the
				// entry fall idle; maxIdle keys falling idle after it
				// push it out of the table.
				if err := a.Refresh(ctx, time.Minute); !errors.Is(err, driver.ErrNotHeld) {
					t.Fatalf("Refresh of an expired lease: %v, want ErrNotHeld", err)
				}
				for i := range maxIdle {
					lease, err := l.Acquire(ctx, fmt.Sprintf("k%d", i), long)
					if err != nil {
						t.Fatal(err)
					}
					if err := lease.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				b, err := l.Acquire(ctx, next, long)
				if err != nil {
					t.Fatal(err)
				}
				if b.(*lease).e != a.(*lease).e {
					t.Fatal("the new holder was given another entry; the test no longer reuses one")
				}
				if err := a.Refresh(ctx, time.Minute); !errors.Is(err, driver.ErrNotHeld) {
					t.Fatalf("Refresh of a lease whose entry was reused: %v, want ErrNotHeld", err)
				}
				if err := a.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
					t.Fatalf("Release of a lease whose entry was reused: %v, want ErrNotHeld", err)
				}
				if _, err := l.Acquire(ctx, next, long); err != driver.ErrNotAcquired {
					t.Fatalf("acquisition of %q, held by the entry's new holder: %v, want ErrNotAcquired", next, err)
				}
				if err := b.Release(ctx); err != nil {
					t.Fatalf("the new holder's release: %v", err)
				}
			})
		})
	}
}

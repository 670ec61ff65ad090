package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// handingRecords are the waiter's records a release hands the lock to, or
// takes out and puts back: this version's, and an earlier version's,
// which has no TTL.
var handingRecords = []string{"ch\n60000\nwaiter", "\nearlier"}

// heldWithWaiter takes a lease of a minute, as a user of admin's server,
// on a lock that a waiter of record (due in a minute) waits for, so that
// the grant finds the waiting flag and the lease's release hands the lock
// over in the one SET GET that takes it from the owner.
func heldWithWaiter(t *testing.T, admin *goredis.Client, l *Locker, key, record string) driver.Lease {
	t.Helper()
	ctx := context.Background()
	keyUntilDayAfter(t, admin, key)
	lock, waiters := lockWaitersOf(key)
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ZAdd(ctx, waiters, goredis.Z{Score: float64(now.UnixMilli() + 60000), Member: record}).Err(); err != nil {
		t.Fatal(err)
	}
	f := strings.Split(admin.Get(ctx, lock).Val(), ":")
	f[3] = "1"
	if err := admin.Do(ctx, "set", lock, strings.Join(f, ":"), "keepttl").Err(); err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

// TestLostKeyStaysLostHanding: a release whose grant found a waiter, of a
// lock whose key is gone, writes nothing, and puts the waiter's record it
// took back. Its SET GET, which writes the grant in the waiter's name or
// the free state, created the key, with no expiry, which then stayed for
// good: a grant to a waiter that holds nothing.
func TestLostKeyStaysLostHanding(t *testing.T) {
	for _, record := range handingRecords {
		t.Run(strconv.Quote(record), func(t *testing.T) {
			ctx := context.Background()
			admin, user := serverWithout(t, "+del")
			const key = "warden:lost/handing"
			lock, waiters := lockWaitersOf(key)
			lease := heldWithWaiter(t, admin, user(), key, record)
			if err := admin.Del(ctx, lock).Err(); err != nil {
				t.Fatal(err)
			}
			err := lease.Release(ctx)
			if n := admin.Exists(ctx, lock).Val(); n != 0 {
				t.Errorf("the release (%v) of a lost key left it: %q, pttl %v", err, admin.Get(ctx, lock).Val(), admin.PTTL(ctx, lock).Val())
			}
			if got := admin.ZRange(ctx, waiters, 0, -1).Val(); len(got) != 1 || got[0] != record {
				t.Errorf("the waiters %q, want the record put back", got)
			}
		})
	}
}

// TestPutBackHandingExpires: a release whose grant found a waiter, of a
// lease that is no longer as its grant left it, puts the waiter's record
// it took back into the set its taking emptied with an expiry of the
// record's time left, counted from when it took the record: for a lock
// taken over by another owner since, and for the owner's own state with
// the waiting flag gone (where nothing takes the record out again).
func TestPutBackHandingExpires(t *testing.T) {
	states := []struct {
		name string
		set  func(f []string) []string
	}{
		{"taken over", func(f []string) []string {
			return []string{f[0], f[1] + "0", f[2], "1", "other"}
		}},
		{"the owner's without the flag", func(f []string) []string {
			return []string{f[0], f[1], f[2], "0", f[4]}
		}},
	}
	for _, s := range states {
		for _, record := range handingRecords {
			t.Run(s.name+"/"+strconv.Quote(record), func(t *testing.T) {
				ctx := context.Background()
				admin, user := serverWithout(t, "+pexpireat")
				const key = "warden:putback/handing"
				lock, waiters := lockWaitersOf(key)
				lease := heldWithWaiter(t, admin, user(), key, record)
				state := strings.Join(s.set(strings.SplitN(admin.Get(ctx, lock).Val(), ":", 5)), ":")
				if err := admin.Do(ctx, "set", lock, state, "keepttl").Err(); err != nil {
					t.Fatal(err)
				}
				err := lease.Release(ctx)
				if got := admin.ZRange(ctx, waiters, 0, -1).Val(); len(got) != 1 || got[0] != record {
					t.Fatalf("the release (%v) left the waiters %q, want the record put back", err, got)
				}
				if pttl := admin.PTTL(ctx, waiters).Val(); pttl <= 0 || pttl > time.Minute {
					t.Errorf("the release (%v) left the waiters a pttl of %v, want the record's minute at most", err, pttl)
				}
			})
		}
	}
}

// TestReservingReleaseChecksOwner: the release of a fair lease whose grant
// found the queue announced writes the reservation for the head of the
// queue in the SET GET that checks the owner's state. A state taken over
// by another owner is written back, and a key that is gone stays gone,
// with the head queued and nothing reserved; the owner's state with
// another token is freed, and the lock reserved for the head with a token
// past that state's; a dead head is dropped, and the lock freed without
// the flag.
func TestReservingReleaseChecksOwner(t *testing.T) {
	for _, c := range []string{"taken over", "key gone", "another token", "dead head"} {
		t.Run(c, func(t *testing.T) {
			ctx := context.Background()
			admin, l, key, n := lockOfTest(t)
			// The queue announced in the free state, before a fair
			// grant with nobody queued, which takes the flag.
			first, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			first.Release(ctx)
			f := strings.Split(admin.Get(ctx, n.lock).Val(), ":")
			f[3] = "2"
			if err := admin.Do(ctx, "set", n.lock, strings.Join(f, ":"), "keepttl").Err(); err != nil {
				t.Fatal(err)
			}
			lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Fair: true})
			if err != nil {
				t.Fatal(err)
			}
			left := time.Minute
			if c == "dead head" {
				left = -time.Second
			}
			head := ghost(t, admin, key, "warden:wake:nobody\nhead-owner", time.Minute, left)
			f = strings.Split(admin.Get(ctx, n.lock).Val(), ":")
			// A later token, as a grant after the lease's would draw.
			tk, _ := strconv.ParseUint(f[1], 10, 64)
			later := strconv.FormatUint(tk+1000, 10)
			switch c {
			case "taken over":
				f[1], f[4] = later, "other"
			case "another token":
				f[1] = later
			}
			state := strings.Join(f, ":")
			if err := admin.Do(ctx, "set", n.lock, state, "keepttl").Err(); err != nil {
				t.Fatal(err)
			}
			if c == "key gone" {
				admin.Del(ctx, n.lock)
			}
			err = lease.Release(ctx)
			got := strings.Split(admin.Get(ctx, n.lock).Val(), ":")
			switch c {
			case "taken over":
				if !errors.Is(err, driver.ErrNotHeld) || strings.Join(got, ":") != state || !queued(t, admin, key, head) {
					t.Errorf("release: %v, state %q, head queued %v; want ErrNotHeld, %q kept, the head queued", err, got, queued(t, admin, key, head), state)
				}
			case "key gone":
				if !errors.Is(err, driver.ErrNotHeld) || admin.Exists(ctx, n.lock).Val() != 0 || !queued(t, admin, key, head) {
					t.Errorf("release: %v, state %q, head queued %v; want ErrNotHeld, no key, the head queued", err, got, queued(t, admin, key, head))
				}
			case "another token":
				reserved, _ := strconv.ParseUint(got[1], 10, 64)
				if err != nil || len(got) != 5 || got[4] != "head-owner" || reserved <= tk+1000 {
					t.Errorf("release: %v, state %q; want the lock reserved for the head, with a token past %s", err, got, later)
				}
			case "dead head":
				if err != nil || len(got) != 5 || got[0] != "0" || got[3] != "0" || queued(t, admin, key, head) {
					t.Errorf("release: %v, state %q, head queued %v; want the lock free without the flag, the head dropped", err, got, queued(t, admin, key, head))
				}
			}
		})
	}
}

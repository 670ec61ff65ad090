package redislock

import (
	"context"
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

package redislock

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestReleaseWithoutChannelRights: an ACL user without the Pub/Sub
// channels can still take and give back locks. A release's message is only
// a wake-up, which waiters make up for by trying again: a release that the
// server refused the message did release the lock (scripts are not rolled
// back), and says so, rather than fail with the PUBLISH's error; and the
// waiter it was for still gets the lock.
func TestReleaseWithoutChannelRights(t *testing.T) {
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Do(ctx, "acl", "setuser", "nochannels", "on", ">pw", "~*", "resetchannels", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	locker := func() *Locker {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "nochannels", Password: "pw"})
		t.Cleanup(func() { c.Close() })
		return newLocker(t, c)
	}
	holder, waiter := locker(), locker()
	for _, kind := range []string{"plain", "fair", "write", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			key := "nochannels/" + kind
			acquire := func(l *Locker, ctx context.Context, opts driver.AcquireOptions) (driver.Lease, error) {
				opts.Fair = kind == "fair"
				switch kind {
				case "write":
					return l.AcquireWrite(ctx, key, opts)
				case "semaphore":
					return l.AcquireSemaphore(ctx, key, 1, opts)
				}
				return l.Acquire(ctx, key, opts)
			}
			held, err := acquire(holder, ctx, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan driver.Lease, 1)
			failed := make(chan error, 1)
			go func() {
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				lease, err := acquire(waiter, wctx, driver.AcquireOptions{TTL: time.Minute, Wait: true})
				if err != nil {
					failed <- err
					return
				}
				got <- lease
			}()
			// Released once the waiter waits, so that the release has
			// someone to tell.
			eventually(t, "the waiter waits", func() bool { return waiting(t, admin, key, kind) })
			if err := held.Release(ctx); err != nil {
				t.Errorf("release with a waiter: %v", err)
			}
			select {
			case lease := <-got:
				if err := lease.Release(ctx); err != nil {
					t.Errorf("the waiter's release: %v", err)
				}
			case err := <-failed:
				t.Fatalf("the waiter: %v", err)
			}
		})
	}
}

// waiting reports whether a waiter of key, of the given kind, has
// recorded itself.
func waiting(t *testing.T, c *goredis.Client, key, kind string) bool {
	t.Helper()
	if kind == "semaphore" {
		// A waiting permit records nothing: its attempts do.
		return true
	}
	n := namesOf(key)
	name := map[string]string{"plain": mutexNamesOf(key).waiters, "fair": mutexNamesOf(key).queue, "write": n.writeWaiters()}[kind]
	exists, err := c.Exists(context.Background(), name).Result()
	if err != nil {
		t.Fatal(err)
	}
	return exists == 1
}

package redislock

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestReleaseSentOnce: a release whose answer is lost with its
// connection, on a client with go-redis's default retries, is not sent
// again: sent again, it found the lease released (or handed to a waiter)
// by the first and answered ErrNotHeld, which guard takes for a lock lost
// during the section. It fails as unavailable, the lock released all the
// same.
func TestReleaseSentOnce(t *testing.T) {
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: time.Minute}
	for _, kind := range []string{"plain", "handed over", "read", "write", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			// A proxy and a client of its own: what one case leaves on
			// its connections stays there.
			p := drivertest.StartProxy(t, s.Addr())
			c := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
			defer c.Close()
			l := newLocker(t, c)
			key := "once/" + kind
			n := namesOf(key)
			var held driver.Lease
			var err error
			// released reports whether the server ran the release.
			var released func() bool
			// A cycle first, so that the scripts are loaded and a
			// connection is idle: the release goes out at once.
			for range 2 {
				if held != nil {
					if err := held.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				switch kind {
				case "read":
					held, err = l.AcquireRead(ctx, key, opts)
					released = func() bool { return admin.ZCard(ctx, n.readers()).Val() == 0 }
				case "write":
					held, err = l.AcquireWrite(ctx, key, opts)
					released = func() bool { return admin.Exists(ctx, n.writer()).Val() == 0 }
				case "semaphore":
					held, err = l.AcquireSemaphore(ctx, key, 1, opts)
					released = func() bool { return admin.ZCard(ctx, n.permits()).Val() == 0 }
				default:
					held, err = l.Acquire(ctx, key, opts)
					state := admin.Get(ctx, lockKeyOf(key)).Val()
					released = func() bool { return admin.Get(ctx, lockKeyOf(key)).Val() != state }
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if kind == "handed over" {
				waiter := newLocker(t, admin)
				go waiter.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true})
				eventually(t, "the waiter is recorded", func() bool { return admin.Exists(ctx, mutexNamesOf(key).waiters).Val() == 1 })
				state := admin.Get(ctx, lockKeyOf(key)).Val()
				released = func() bool { return admin.Get(ctx, lockKeyOf(key)).Val() != state }
			}
			// The answer is lost; once the server has run the release,
			// the connection is reset, and a release sent again would be
			// answered.
			p.LoseReplies()
			defer p.Reset()
			done := make(chan error, 1)
			go func() { done <- held.Release(ctx) }()
			eventually(t, "the server ran the release", released)
			p.Reset()
			if err := <-done; errors.Is(err, driver.ErrNotHeld) || !errors.Is(err, driver.ErrUnavailable) {
				t.Errorf("release answered late: got %v, want ErrUnavailable", err)
			}
		})
	}
}

package redislock

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
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

// TestStoreChangeSentOnce: the Store's Complete, Abandon and Delete whose
// answer is lost, as in TestReleaseSentOnce, are not sent again: sent
// again, each found its own change made and answered ErrNotOwner (Delete
// ErrNotFound), as if another owner had the record. They fail as
// unavailable, the change made all the same.
func TestStoreChangeSentOnce(t *testing.T) {
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	ctx := context.Background()
	const owner = "owner-0123456789abcdef"
	for _, op := range []string{"complete", "abandon", "delete"} {
		t.Run(op, func(t *testing.T) {
			p := drivertest.StartProxy(t, s.Addr())
			c := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
			defer c.Close()
			st, err := NewStore(c)
			if err != nil {
				t.Fatal(err)
			}
			// A cycle first, so that the scripts are loaded and a
			// connection is idle: the change goes out at once.
			change := func(k string) error {
				switch op {
				case "abandon":
					return st.Abandon(ctx, "s", k, owner)
				case "delete":
					return st.Delete(ctx, "s", k, owner)
				}
				return st.Complete(ctx, "s", k, owner, []byte("r"), time.Minute)
			}
			warm, k := "warm-"+op, "k-"+op
			for _, k := range []string{warm, k} {
				if _, err := st.Claim(ctx, idempotency.Claim{Scope: "s", Key: k, Fingerprint: "f", Owner: owner, Lease: time.Minute}); err != nil {
					t.Fatal(err)
				}
			}
			if err := change(warm); err != nil {
				t.Fatal(err)
			}
			rk := st.recordKey("s", k)
			made := func() bool { return admin.Exists(ctx, rk).Val() == 0 }
			if op == "complete" {
				made = func() bool { return admin.HGet(ctx, rk, "state").Val() == string(idempotency.StateCompleted) }
			}
			p.LoseReplies()
			defer p.Reset()
			done := make(chan error, 1)
			go func() { done <- change(k) }()
			eventually(t, "the server made the change", made)
			p.Reset()
			if err := <-done; errors.Is(err, idempotency.ErrNotOwner) || errors.Is(err, idempotency.ErrNotFound) || !errors.Is(err, idempotency.ErrUnavailable) {
				t.Errorf("%s answered late: got %v, want ErrUnavailable", op, err)
			}
		})
	}
}

// TestForceReleaseSentOnce: an operator's ForceRelease whose answer is
// lost, as in TestReleaseSentOnce, is not sent again: sent again, it found
// the lock freed by the first and answered that nothing was removed (or,
// had a waiter been handed the lock, that it had changed hands). It fails
// as unavailable, the holder removed all the same.
func TestForceReleaseSentOnce(t *testing.T) {
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	ctx := context.Background()
	p := drivertest.StartProxy(t, s.Addr())
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
	defer c.Close()
	holder, operator := newLocker(t, admin), newLocker(t, c)
	const key = "once/force"
	anyHolder := driver.ReleaseTarget{AnyHolder: true}
	// A forced release first, so that the script is loaded and a
	// connection is idle: the second goes out at once.
	if _, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if removed, err := operator.ForceRelease(ctx, key, anyHolder); err != nil || len(removed) != 1 {
		t.Fatalf("first forced release: %v, %v; want one holder removed", removed, err)
	}
	if _, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	state := admin.Get(ctx, lockKeyOf(key)).Val()
	p.LoseReplies()
	defer p.Reset()
	type answer struct {
		removed []driver.Holding
		err     error
	}
	done := make(chan answer, 1)
	go func() {
		removed, err := operator.ForceRelease(ctx, key, anyHolder)
		done <- answer{removed, err}
	}()
	eventually(t, "the server ran the forced release", func() bool { return admin.Get(ctx, lockKeyOf(key)).Val() != state })
	p.Reset()
	if a := <-done; !errors.Is(a.err, driver.ErrUnavailable) || errors.Is(a.err, driver.ErrHolderChanged) {
		t.Errorf("forced release answered late: got %v, %v; want ErrUnavailable", a.removed, a.err)
	}
}

package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// ghost queues a fair place for key that nobody waits on, as a promoted
// replica keeps those of the waiters that the grants it missed let in: its
// waiter timeout is period and its deadline lapses in left.
func ghost(t *testing.T, c *goredis.Client, key, name string, period, left time.Duration) string {
	t.Helper()
	ctx := context.Background()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	n := namesOf(key)
	place := fmt.Sprintf("%d:%s", period.Milliseconds(), name)
	if err := c.RPush(ctx, n.queue(), place).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := float64(now.Add(left).UnixMilli())
	if err := c.ZAdd(ctx, n.deadlines(), goredis.Z{Score: deadline, Member: place}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{n.queue(), n.deadlines()} {
		c.PExpire(ctx, k, time.Minute)
	}
	return place
}

// lockOfTest returns a client to look at the server with, a Locker on a
// client of its own, and a key of the test's own with its names.
func lockOfTest(t *testing.T) (*goredis.Client, *Locker, string, mutexNames) {
	t.Helper()
	key := testKey(t)
	return newClient(t), newLocker(t, newClient(t)), key, mutexNamesOf(key)
}

// queued reports whether place is still in key's fair queue.
func queued(t *testing.T, c *goredis.Client, key, place string) bool {
	t.Helper()
	_, err := c.ZScore(context.Background(), namesOf(key).deadlines(), place).Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatal(err)
	}
	return err == nil
}

// acquireWithin takes key fairly, failing the test when that takes until
// the places ahead would lapse by themselves (30s and more): what the fair
// queue must not wait for.
func acquireWithin(t *testing.T, l *Locker, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Fair: true})
	if err != nil {
		t.Fatalf("fair Acquire behind places nobody renews: %v", err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestFairSkipsGhosts: places nobody renews any more (the ghosts a promoted
// replica keeps of the waiters that the grants it missed let in) do not hold
// a free lock until their deadlines lapse.
func TestFairSkipsGhosts(t *testing.T) {
	for _, c := range []struct {
		name         string
		n            int
		period, left time.Duration
	}{
		// Renewed every 20s, last 30s ago: late, so dropped at once.
		{"late heads", 3, time.Minute, 30 * time.Second},
		// Renewed just now, as far as the queue can tell (a quick
		// failover, or a wake-up lost): each has a handoff window.
		{"heads on time", 2, time.Minute, time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			probe := newClient(t)
			key := testKey(t)
			var ghosts []string
			for i := range c.n {
				ghosts = append(ghosts, ghost(t, probe, key, fmt.Sprintf("ghost-%d", i), c.period, c.left))
			}
			acquireWithin(t, newLocker(t, newClient(t)), key)
			for _, g := range ghosts {
				if queued(t, probe, key, g) {
					t.Errorf("%s still queued", g)
				}
			}
		})
	}
}

// TestFairSparesWaitersOnTime: a head with a shorter waiter timeout than the
// contender behind it, renewing on time, keeps its place and is given the
// window to claim the lock; it is not judged by the contender's timeout.
func TestFairSparesWaitersOnTime(t *testing.T) {
	c := newClient(t)
	key := testKey(t)
	// Renewed every 3.3s, last a moment ago; by a minute's timeout, it
	// would be 50s late.
	head := ghost(t, c, key, "short", 10*time.Second, 9900*time.Millisecond)
	l := newLocker(t, newClient(t), WithWaiterTimeout(time.Minute))
	if _, err := l.Acquire(context.Background(), key, driver.AcquireOptions{TTL: time.Second, Fair: true}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("fair TryLock behind a live head: got %v, want ErrNotAcquired", err)
	}
	if !queued(t, c, key, head) {
		t.Error("the head on time lost its place to a contender with a longer waiter timeout")
	}
}

// TestFairLapsedHeadClaims: the head of a free lock's queue whose place
// lapsed (a waiter stalled past its deadline) takes the lock when it comes
// back before anyone behind it has dropped it: it is the oldest live
// waiter, and the one behind it keeps its place.
func TestFairLapsedHeadClaims(t *testing.T) {
	c := newClient(t)
	l := newLocker(t, c)
	key := testKey(t)
	me := ghost(t, c, key, "stalled", time.Minute, -time.Second)
	behind := ghost(t, c, key, "behind", time.Minute, time.Minute)
	n := mutexNamesOf(key)
	r, err := run(context.Background(), l.sc, l.s.fairAcquire, []string{n.lock, n.queue, n.deadlines},
		"owner", int64(1000), "1", time.Minute.Milliseconds(), maxHandoff.Milliseconds(), n.channel, me)
	if err != nil {
		t.Fatal(err)
	}
	if r[0] != 1 {
		t.Errorf("the lapsed head was refused the free lock: %v", r)
	}
	if queued(t, c, key, me) {
		t.Error("the head that took the lock is still queued")
	}
	if !queued(t, c, key, behind) {
		t.Error("the waiter behind lost its place")
	}
}

// TestFairQueueOutlastsPlaces: a fair attempt reads the expiry of the
// queue's deadlines only, and the list of places must still outlast every
// live place. A waiter that makes the list anew, while the deadlines
// expire later than its own timeout asks (a waiter with a longer one
// extended them), gives the list the deadlines' expiry: the longer-lived
// waiter, whose renewals find the deadlines' expiry long enough and leave
// the list's as it is, keeps its place.
func TestFairQueueOutlastsPlaces(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	l := newLocker(t, c)
	key := testKey(t)
	n := mutexNamesOf(key)
	holder, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	// A place of a waiter with a minute's timeout, its deadlines expiring
	// in ten minutes; the list is empty.
	ghost(t, c, key, "long", time.Minute, time.Minute)
	if err := c.PExpire(ctx, n.deadlines, 10*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, n.queue).Err(); err != nil {
		t.Fatal(err)
	}
	me := "5000:" + l.wake + "\nshort"
	r, err := run(ctx, l.sc, l.s.fairAcquire, []string{n.lock, n.queue, n.deadlines},
		"short", int64(1000), "1", int64(5000), int64(1000), n.channel, me)
	if err != nil || r[0] != 0 {
		t.Fatalf("a fair attempt on a held lock: %v, %v, want a refusal", r, err)
	}
	if places := c.LRange(ctx, n.queue, 0, -1).Val(); !slices.Equal(places, []string{me}) {
		t.Fatalf("the places after the attempt: %q", places)
	}
	list, zset := c.PTTL(ctx, n.queue).Val(), c.PTTL(ctx, n.deadlines).Val()
	if list < zset-time.Second {
		t.Errorf("the list made by a waiter of a 5s timeout expires in %v, before the deadlines (in %v)", list, zset)
	}
}

// TestFairReleaseReservesForHead: a release that finds a live head of the
// fair queue reserves the lock for it, granted in its owner's name for its
// handoff window (a fifth of its waiter timeout here), with a token past
// the holder's: nobody else takes the lock meanwhile, and the head's claim
// extends it to its TTL. A head that lets the reservation lapse, without
// renewing its place since, is gone: the waiter behind it takes the lock
// at its first attempt after the lapse, with no window more. One that
// renewed its place (an earlier version's, which does not claim a
// reservation) keeps its place and its window.
func TestFairReleaseReservesForHead(t *testing.T) {
	for _, c := range []string{"claimed", "lapsed", "renewed"} {
		t.Run(c, func(t *testing.T) {
			ctx := context.Background()
			admin, l, key, n := lockOfTest(t)
			holder, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			// The head: a waiter timeout of a second, so a window of
			// 200ms, its place renewed 100ms ago; the waiter behind
			// it, whose attempt announces the queue in the lock's
			// state.
			head := ghost(t, admin, key, "warden:wake:nobody\nhead-owner", time.Second, 900*time.Millisecond)
			behind := "60000:warden:wake:nobody\nbehind-owner"
			attempt := func(owner, place, mode string) reply {
				t.Helper()
				r, err := run(ctx, l.sc, l.s.fairAcquire, []string{n.lock, n.queue, n.deadlines},
					owner, int64(10000), mode, int64(60000), int64(250), n.channel, place)
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			if r := attempt("behind-owner", behind, "1"); r[0] != 0 {
				t.Fatalf("the attempt behind the head and the holder: %v", r)
			}
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			now, err := admin.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Split(admin.Get(ctx, n.lock).Val(), ":")
			deadline, _ := strconv.ParseInt(f[0], 10, 64)
			token, _ := strconv.ParseUint(f[1], 10, 64)
			if len(f) != 5 || f[4] != "head-owner" || deadline <= now.UnixMilli() || deadline > now.UnixMilli()+200 || token <= holder.Token() {
				t.Fatalf("the state after the release: %q (server clock %d), want the head's, for 200ms at most, with a token past %d",
					f, now.UnixMilli(), holder.Token())
			}
			if _, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("a non-fair TryLock while the lock is reserved: %v, want ErrNotAcquired", err)
			}
			switch c {
			case "claimed":
				r := attempt("head-owner", head, "2")
				if r[0] != 1 || uint64(r[1]) != token {
					t.Fatalf("the head's claim: %v, want the reserved token %d", r, token)
				}
				if pttl := admin.Get(ctx, n.lock).Val(); !strings.Contains(pttl, ":head-owner") {
					t.Fatalf("the state after the claim: %q", pttl)
				}
				d, _ := strconv.ParseInt(strings.Split(admin.Get(ctx, n.lock).Val(), ":")[0], 10, 64)
				if d < now.UnixMilli()+9000 {
					t.Errorf("the claim's deadline %d, want its TTL of 10s past %d", d, now.UnixMilli())
				}
				if queued(t, admin, key, head) {
					t.Error("the head that claimed is still queued")
				}
				return
			case "renewed":
				// Its place renewed after the reservation, as an
				// earlier version's refused attempt does.
				if err := admin.ZAdd(ctx, n.deadlines, goredis.Z{Score: float64(now.UnixMilli() + 1000), Member: head}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, "the reservation lapses", func() bool {
				now, err := admin.Time(ctx).Result()
				return err == nil && now.UnixMilli() > deadline
			})
			r := attempt("behind-owner", behind, "2")
			switch {
			case c == "lapsed" && (r[0] != 1 || queued(t, admin, key, head)):
				t.Errorf("the attempt behind a head that let its reservation lapse: %v, head queued %v; want the lock, the head dropped",
					r, queued(t, admin, key, head))
			case c == "renewed" && (r[0] != 0 || !queued(t, admin, key, head)):
				t.Errorf("the attempt behind a head that renewed its place: %v, head queued %v; want a refusal, the head kept",
					r, queued(t, admin, key, head))
			}
		})
	}
}

// TestFairAttemptWithReleaseClock: the first attempt of a contender whose
// release reserved the lock a moment ago sends that release's clock, which
// the attempt takes for the server's when the lock is held by another
// until past it: it is then refused and queued even when the lease ran out
// since (it never grants on that clock). A lock in the contender's own
// name, or free by that clock, is judged by the server's TIME: a grant
// counts its lease from the server's clock, not the release's.
func TestFairAttemptWithReleaseClock(t *testing.T) {
	for _, c := range []string{"another's, lapsed since", "another's, lapsed before", "its own, lapsed since", "another's, control"} {
		t.Run(c, func(t *testing.T) {
			ctx := context.Background()
			admin, l, _, n := lockOfTest(t)
			now, err := admin.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			// A release a second ago; the lease it left ran out 950ms ago.
			clock := now.UnixMilli() - 1000
			owner := "other"
			if c == "its own, lapsed since" {
				owner = "me"
			}
			const token = 4242
			// Free by the release's clock, in the case lapsed before.
			deadline := clock + 50
			if c == "another's, lapsed before" {
				deadline = clock - 50
			}
			state := fmt.Sprintf("%d:%d:%d:2:%s", deadline, token, now.UnixMilli()/86400000+2, owner)
			if err := admin.Set(ctx, n.lock, state, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			args := []any{"me", int64(10000), "1", int64(60000), int64(250), n.channel, "60000:warden:wake:nobody\nme"}
			if c != "another's, control" {
				args = append(args, clock)
			}
			r, err := run(ctx, l.sc, l.s.fairAcquire, []string{n.lock, n.queue, n.deadlines}, args...)
			if err != nil {
				t.Fatal(err)
			}
			d, _ := strconv.ParseInt(strings.Split(admin.Get(ctx, n.lock).Val(), ":")[0], 10, 64)
			switch c {
			case "another's, lapsed since":
				if r[0] != 0 || r[1] != 50 || admin.LLen(ctx, n.queue).Val() != 1 {
					t.Errorf("the attempt: %v, queue %d; want a refusal for the 50ms the lease had by the release's clock, and a place",
						r, admin.LLen(ctx, n.queue).Val())
				}
			default:
				if r[0] != 1 || r[1] <= token || d < now.UnixMilli()+9000 {
					t.Errorf("the attempt: %v, deadline %d; want a grant with a token past %d, until 10s past the server's clock %d",
						r, d, token, now.UnixMilli())
				}
			}
		})
	}
}

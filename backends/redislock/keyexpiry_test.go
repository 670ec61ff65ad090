package redislock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

const dayMs = 86400000

// TestLostKeyStaysLost: a renewal or a release of a lock whose key is gone
// (deleted by hand, a restart without persistence) writes nothing. Their
// SET created the key, without an expiry, and the script took it back by
// DEL: for a user without DEL the key stayed for good, a renewal's with
// the lease extended, which the next renewal then took for its own.
func TestLostKeyStaysLost(t *testing.T) {
	ctx := context.Background()
	admin, user := serverWithout(t, "+del")
	l := user()
	const key = "warden:lost/key"
	lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"Refresh", func() error { return lease.Refresh(ctx, time.Minute) }},
		{"RefreshBatch", func() error { return l.RefreshBatch(ctx, []driver.Lease{lease}, time.Minute)[0] }},
		{"Refresh again", func() error { return lease.Refresh(ctx, time.Minute) }},
		{"Release", func() error { return lease.Release(ctx) }},
	}
	for _, s := range steps {
		if err := admin.Del(ctx, lockKeyOf(key)).Err(); err != nil {
			t.Fatal(err)
		}
		err := s.do()
		if s.what != "Release" && err == nil {
			t.Errorf("%s of a lost key succeeded", s.what)
		}
		if n := admin.Exists(ctx, lockKeyOf(key)).Val(); n != 0 {
			v := admin.Get(ctx, lockKeyOf(key)).Val()
			t.Errorf("%s of a lost key left it: %q, pttl %v (err %v)", s.what, v, admin.PTTL(ctx, lockKeyOf(key)).Val(), err)
		}
	}
}

// keyUntilDayAfter makes key's state a free lock whose key expires at the
// end of the day after tomorrow (server clock): a lease of a minute taken
// on it needs no later day, one of three days does.
func keyUntilDayAfter(t *testing.T, admin *goredis.Client, key string) {
	t.Helper()
	ctx := context.Background()
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	day := now.UnixMilli()/dayMs + 3
	if err := admin.Do(ctx, "set", lockKeyOf(key), "0:1:"+strconv.FormatInt(day, 10)+":0:", "pxat", day*dayMs).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestPutBackRecordExpires: a release that takes a waiter's record out of
// the waiters and puts it back (a record of an earlier version, which it
// does not hand the lock to) into the set that the taking emptied gives
// the set the record's deadline as its expiry by PEXPIRE, which the
// documented rules have: by PEXPIREAT, it was refused after the record was
// back, for a user without it.
func TestPutBackRecordExpires(t *testing.T) {
	ctx := context.Background()
	admin, user := serverWithout(t, "+pexpireat")
	const key = "warden:putback/record"
	keyUntilDayAfter(t, admin, key)
	lock, waiters := lockWaitersOf(key)
	lease, err := user().Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// A waiter of an earlier version announced itself: its record has no
	// TTL, and the state's waiting flag is set.
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ZAdd(ctx, waiters, goredis.Z{Score: float64(now.UnixMilli() + 60000), Member: "\nearlier"}).Err(); err != nil {
		t.Fatal(err)
	}
	f := strings.Split(admin.Get(ctx, lock).Val(), ":")
	f[3] = "1"
	if err := admin.Do(ctx, "set", lock, strings.Join(f, ":"), "keepttl").Err(); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("release: %v", err)
	}
	if n := admin.ZCard(ctx, waiters).Val(); n != 1 {
		t.Errorf("%d records left, want the one put back", n)
	}
	if pttl := admin.PTTL(ctx, waiters).Val(); pttl <= 0 || pttl > time.Minute {
		t.Errorf("the waiters' pttl %v, want the record's minute at most", pttl)
	}
}

// keyCovers checks that the lock's key, when present, expires, and not
// before the deadline its state holds: a lease whose key expires first is
// granted again to another while its holder still works.
func keyCovers(t *testing.T, admin *goredis.Client, key, when string) {
	t.Helper()
	ctx := context.Background()
	lock := lockKeyOf(key)
	v, err := admin.Get(ctx, lock).Result()
	if err == goredis.Nil {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	pttl, err := admin.PTTL(ctx, lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if pttl < 0 {
		t.Errorf("%s: the key holds %q and never expires", when, v)
		return
	}
	deadline, err := strconv.ParseInt(strings.SplitN(v, ":", 2)[0], 10, 64)
	if err != nil {
		t.Fatalf("%s: state %q: %v", when, v, err)
	}
	if expires := now.UnixMilli() + pttl.Milliseconds(); expires < deadline {
		t.Errorf("%s: the key expires at %d, %v before the lease it holds ends (%q)",
			when, expires, time.Duration(deadline-expires)*time.Millisecond, v)
	}
}

// TestRenewalMovesTheKeysDay: a renewal whose lease ends past the day the
// key expires with moves the key's expiry with the state, for a user
// without PEXPIREAT too. The renewal wrote the extended state and then set
// the expiry by PEXPIREAT: refused, the script stopped with the new day
// written, and the next renewal, finding it, succeeded with the key's old
// expiry, hours before the lease's end.
func TestRenewalMovesTheKeysDay(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "Refresh"
		if batch {
			name = "RefreshBatch"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			admin, user := serverWithout(t, "+pexpireat")
			l := user()
			const key = "warden:renewal/day"
			keyUntilDayAfter(t, admin, key)
			lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			keyCovers(t, admin, key, "granted")
			for i := range 2 {
				if batch {
					err = l.RefreshBatch(ctx, []driver.Lease{lease}, 72*time.Hour)[0]
				} else {
					err = lease.Refresh(ctx, 72*time.Hour)
				}
				if err != nil {
					t.Errorf("renewal %d: %v", i, err)
				}
				keyCovers(t, admin, key, "renewed "+strconv.Itoa(i))
			}
		})
	}
}

// TestGrantMovesTheKeysDay: a grant on a key that did not exist, or whose
// day is too early for the lease, sets the key's expiry with its state, for
// a user without PEXPIREAT too; and so does a release that hands the lock
// to a waiter whose lease ends later. Each set the state first and the
// expiry by PEXPIREAT after: refused, the state stayed, with a key that
// never expired or expired before the lease's end.
func TestGrantMovesTheKeysDay(t *testing.T) {
	ctx := context.Background()
	for _, fair := range []bool{false, true} {
		t.Run("fair="+strconv.FormatBool(fair), func(t *testing.T) {
			admin, user := serverWithout(t, "+pexpireat")
			l := user()
			opts := driver.AcquireOptions{TTL: time.Minute, Fair: fair}
			lease, err := l.Acquire(ctx, "warden:grant/new", opts)
			if err != nil {
				t.Errorf("a grant on a new key: %v", err)
			}
			keyCovers(t, admin, "warden:grant/new", "granted on a new key")
			if lease != nil {
				lease.Release(ctx)
			}
			const key = "warden:grant/day"
			keyUntilDayAfter(t, admin, key)
			opts.TTL = 72 * time.Hour
			if _, err := l.Acquire(ctx, key, opts); err != nil {
				t.Errorf("a grant for three days: %v", err)
			}
			keyCovers(t, admin, key, "granted for three days")
		})
	}
}

// TestHandoverMovesTheKeysDay: a release that hands the lock to a waiter
// whose lease ends past the key's day moves the key's expiry with the
// grant, for a user without PEXPIREAT too, in both ways a release hands
// over: after freeing the lock (the holder's grant found nobody waiting),
// and in the one SET that takes it from the owner (its grant found a
// waiter).
func TestHandoverMovesTheKeysDay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, user := serverWithout(t, "+pexpireat")
	const key = "warden:handover/day"
	keyUntilDayAfter(t, admin, key)
	_, waiters := lockWaitersOf(key)
	held, err := user().Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// wait starts a waiter with a lease of ttl and returns its outcome
	// once it is recorded.
	wait := func(ttl time.Duration) <-chan driver.Lease {
		got := make(chan driver.Lease, 1)
		go func() {
			w, err := user().Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Wait: true})
			if err != nil {
				t.Errorf("waiter for %v: %v", ttl, err)
			}
			got <- w
		}()
		eventually(t, "the waiter recorded", func() bool { return admin.ZCard(ctx, waiters).Val() == 1 })
		return got
	}
	for i, ttl := range []time.Duration{72 * time.Hour, 144 * time.Hour} {
		got := wait(ttl)
		if err := held.Release(ctx); err != nil {
			t.Errorf("release %d: %v", i, err)
		}
		keyCovers(t, admin, key, "handed over for "+ttl.String())
		held = <-got
		if held == nil {
			return
		}
	}
}

// TestFairWaiterOnAGoneKeyExpires: a fair waiter that queues behind
// another on a lock whose key is gone writes the free state with the
// waiting flag, for the next release to wake the queue, with its expiry in
// the same SET: a PEXPIREAT after it, refused (a user without it), left a
// key that never expired.
func TestFairWaiterOnAGoneKeyExpires(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, user := serverWithout(t, "+pexpireat")
	const key = "warden:fair/gone"
	m := mutexNamesOf(key)
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Another waiter, live, heads the queue.
	head := "60000:" + m.channel + "\nother"
	if err := admin.RPush(ctx, m.queue, head).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ZAdd(ctx, m.deadlines, goredis.Z{Score: float64(now.UnixMilli() + 60000), Member: head}).Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := user().Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true, Fair: true})
		done <- err
	}()
	eventually(t, "the waiter queued", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the waiter's acquisition ended: %v", err)
		default:
		}
		return admin.LLen(ctx, m.queue).Val() == 2
	})
	if v := admin.Get(ctx, m.lock).Val(); !strings.HasSuffix(v, ":2:") {
		t.Errorf("the lock's state %q, want the free state with the fair flag", v)
	}
	keyCovers(t, admin, key, "queued")
}

// TestRefusedClaimLeavesNoRecord: a claim whose record the server refuses
// an expiry (a user without PEXPIRE) fails and leaves no record. Its HSET
// stayed, with no expiry: the request's key was in progress for good, and
// every later request with it refused.
func TestRefusedClaimLeavesNoRecord(t *testing.T) {
	ctx := context.Background()
	admin, _ := serverWithout(t, "+pexpire")
	c := goredis.NewClient(&goredis.Options{Addr: admin.Options().Addr, Username: "w", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c)
	claim := idempotency.Claim{Scope: "s", Key: "k", Fingerprint: "f", Owner: "o", Lease: time.Minute}
	if _, err := s.Claim(ctx, claim); err == nil {
		t.Error("a claim whose expiry was refused succeeded")
	}
	if keys := admin.Keys(ctx, "warden:idem:*").Val(); len(keys) != 0 {
		t.Errorf("the refused claim left %v, pttl %v", keys, admin.PTTL(ctx, keys[0]).Val())
	}
}

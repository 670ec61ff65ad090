package redislock

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// waitFor starts a waiting acquisition of key on l and waits until its
// record is among the lock's waiters (count of them in all).
func waitFor(t *testing.T, admin *goredis.Client, l *Locker, key, owner string, count int64) <-chan driver.Lease {
	t.Helper()
	ctx := context.Background()
	got := make(chan driver.Lease, 1)
	go func() {
		le, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Owner: owner})
		if err != nil {
			t.Errorf("%s: %v", owner, err)
		}
		got <- le
	}()
	eventually(t, owner+" recorded", func() bool {
		n, _ := admin.ZCard(ctx, mutexNamesOf(key).waiters).Result()
		return n == count
	})
	eventually(t, owner+"'s Locker subscribed", func() bool {
		subs, err := admin.PubSubNumSub(ctx, l.wake).Result()
		return err == nil && subs[l.wake] == 1
	})
	// Once its subscription is confirmed, the waiter tries once more, then
	// sleeps for a keep-alive, far beyond the tests.
	time.Sleep(100 * time.Millisecond)
	return got
}

// delta is the server commands run between two serverCalls, by command,
// less the tests' own INFO and ZCARD.
func delta(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for name, v := range after {
		if n := v - before[name]; n > 0 && name != "info" && name != "zcard" {
			d[name] = n
		}
	}
	return d
}

// TestReleaserComesBack: a release whose grant found waiters hands the lock
// to the oldest in 5 server commands (the script, TIME, the record's
// ZPOPMIN, the grant's SET GET, PUBLISH), and the releaser, coming
// straight back, is recorded as a waiter in 4 (the script, the state's GET,
// ZADD, PTTL; here a PEXPIRE more, for the records' key made anew), from
// the clock its release answered; the release that
// follows hands it the lock, with a token past the one before.
func TestReleaserComesBack(t *testing.T) {
	admin, addr := privateClient(t)
	// A long waiter timeout makes the window of the release's clock (a
	// sixteenth of it) long enough for any load.
	newL := func() *Locker {
		return newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}), WithWaiterTimeout(time.Minute))
	}
	a, b, c := newL(), newL(), newL()
	ctx := context.Background()
	const key = "comes-back"
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Owner: "a"}
	first, err := a.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	gotB := waitFor(t, admin, b, key, "b", 1)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held := <-gotB
	if held == nil {
		t.FailNow()
	}
	// b's grant found a waiter (the flag a's waiter set): its release
	// looks for one first.
	gotC := waitFor(t, admin, c, key, "c", 1)
	before := serverCalls(t, admin)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	byC := <-gotC
	if byC == nil {
		t.FailNow()
	}
	want := map[string]int64{"evalsha": 1, "time": 1, "zpopmin": 1, "set": 1, "publish": 1}
	if got := delta(before, serverCalls(t, admin)); !sameCalls(got, want) {
		t.Errorf("the release that handed the lock: %v, want %v", got, want)
	}
	if byC.Token() <= held.Token() {
		t.Errorf("token %d handed after %d", byC.Token(), held.Token())
	}

	// b comes straight back: refused, recorded, no TIME. (The records' key,
	// emptied by the grant to c, is made anew: PEXPIRE gives it its
	// expiry. The script is loaded first, so that it runs by digest.)
	if err := admin.ScriptLoad(ctx, rewaitSrc).Err(); err != nil {
		t.Fatal(err)
	}
	before = serverCalls(t, admin)
	backB := make(chan driver.Lease, 1)
	go func() {
		le, err := b.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Owner: "b"})
		if err != nil {
			t.Errorf("b again: %v", err)
		}
		backB <- le
	}()
	eventually(t, "b recorded again", func() bool {
		n, _ := admin.ZCard(ctx, mutexNamesOf(key).waiters).Result()
		return n == 1
	})
	want = map[string]int64{"evalsha": 1, "get": 1, "zadd": 1, "pttl": 1, "pexpire": 1}
	if got := delta(before, serverCalls(t, admin)); !sameCalls(got, want) {
		t.Errorf("the releaser coming back: %v, want %v", got, want)
	}
	// Its record lapses a waiter timeout after the release's clock.
	recs, err := admin.ZRangeWithScores(ctx, mutexNamesOf(key).waiters, 0, -1).Result()
	if err != nil || len(recs) != 1 {
		t.Fatalf("records: %v, %v", recs, err)
	}
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if lapse := time.UnixMilli(int64(recs[0].Score)).Sub(now); lapse < b.cfg.waiterTimeout-time.Second || lapse > b.cfg.waiterTimeout {
		t.Errorf("b's record lapses in %v, want within a second under the waiter timeout %v", lapse, b.cfg.waiterTimeout)
	}
	if err := byC.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again := <-backB
	if again == nil {
		t.FailNow()
	}
	if again.Token() <= byC.Token() {
		t.Errorf("token %d handed after %d", again.Token(), byC.Token())
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func sameCalls(got, want map[string]int64) bool {
	if len(got) != len(want) {
		return false
	}
	for name, n := range want {
		if got[name] != n {
			return false
		}
	}
	return true
}

// TestReleaserComesBackToFreeLock: when the waiter handed the lock is done
// with it before the releaser comes back, the releaser's first attempt
// does not take the lock for held (which would leave it waiting for a
// release that has come and gone) but takes it.
func TestReleaserComesBackToFreeLock(t *testing.T) {
	admin, addr := privateClient(t)
	// A long waiter timeout makes the window of the release's clock (a
	// sixteenth of it) long enough for any load.
	a := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}), WithWaiterTimeout(time.Minute))
	b := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	ctx := context.Background()
	const key = "comes-back-free"
	first, err := a.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Owner: "a"})
	if err != nil {
		t.Fatal(err)
	}
	gotB := waitFor(t, admin, b, key, "b", 1)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h := a.handedOff.Load(); h == nil {
		t.Fatal("the release that handed the lock left no handoff for the releaser's next attempt")
	}
	held := <-gotB
	if held == nil {
		t.FailNow()
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Loaded first, so that it runs by digest.
	if err := admin.ScriptLoad(ctx, rewaitSrc).Err(); err != nil {
		t.Fatal(err)
	}
	before := serverCalls(t, admin)
	start := time.Now()
	le, err := a.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Owner: "a"})
	if err != nil {
		t.Fatal(err)
	}
	// A refusal would have it wait a quarter of the TTL, 2.5 s.
	if took := time.Since(start); took > time.Second {
		t.Errorf("the free lock took %v to take", took)
	}
	// rewait.lua ran, found the lock free and changed nothing; acquire.lua
	// took it.
	if d := delta(before, serverCalls(t, admin)); d["evalsha"] != 2 || d["zadd"] != 0 {
		t.Errorf("the releaser coming back to a free lock: %v, want 2 scripts (rewait.lua, then acquire.lua) and no record", d)
	}
	if le.Token() <= held.Token() {
		t.Errorf("token %d after %d", le.Token(), held.Token())
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHandingReleaseOfLostLease: the release of a lease whose grant found
// waiters, after the lease ran out and another contender took the lock,
// fails with ErrNotHeld and leaves the new holder's state and the waiters'
// records as they were, though it took a record out to hand the lock to
// first.
func TestHandingReleaseOfLostLease(t *testing.T) {
	admin, addr := privateClient(t)
	newL := func() *Locker { return newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr})) }
	x, a, d, w := newL(), newL(), newL(), newL()
	ctx := context.Background()
	const key = "lost-handing"
	held, err := x.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Owner: "x"})
	if err != nil {
		t.Fatal(err)
	}
	gotA := make(chan driver.Lease, 1)
	go func() {
		le, err := a.Acquire(ctx, key, driver.AcquireOptions{TTL: 300 * time.Millisecond, Wait: true, Owner: "a"})
		if err != nil {
			t.Errorf("a: %v", err)
		}
		gotA <- le
	}()
	eventually(t, "a recorded", func() bool {
		n, _ := admin.ZCard(ctx, mutexNamesOf(key).waiters).Result()
		return n == 1
	})
	eventually(t, "a's Locker subscribed", func() bool {
		subs, err := admin.PubSubNumSub(ctx, a.wake).Result()
		return err == nil && subs[a.wake] == 1
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lost := <-gotA
	if lost == nil {
		t.FailNow()
	}
	if ls := lost.(*lease); ls.waiting != 1 {
		t.Fatalf("a's lease has the waiting flag %d, want 1 (its release looks for a waiter first)", ls.waiting)
	}
	time.Sleep(400 * time.Millisecond)
	taken, err := d.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Owner: "d"})
	if err != nil {
		t.Fatal(err)
	}
	gotW := waitFor(t, admin, w, key, "w", 1)
	if err := lost.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("the lost lease's release: %v, want ErrNotHeld", err)
	}
	in, err := d.Inspect(ctx, key)
	if err != nil || len(in.Holders) != 1 || in.Holders[0].Owner != "d" || in.Holders[0].Token != taken.Token() {
		t.Fatalf("after the lost lease's release: %+v, %v; want d holding with token %d", in, err, taken.Token())
	}
	if n, _ := admin.ZCard(ctx, mutexNamesOf(key).waiters).Result(); n != 1 {
		t.Fatalf("%d records after the lost lease's release, want w's", n)
	}
	// The record was taken out and put back: its key, emptied and made
	// anew meanwhile, must still expire, or a record whose waiter dies
	// stays for good.
	if pttl, err := admin.PTTL(ctx, mutexNamesOf(key).waiters).Result(); err != nil || pttl <= 0 {
		t.Fatalf("the records' key has PTTL %v (%v) after the lost lease's release, want an expiry", pttl, err)
	}
	if err := taken.Release(ctx); err != nil {
		t.Fatal(err)
	}
	le := <-gotW
	if le == nil {
		t.FailNow()
	}
	if le.Token() <= taken.Token() {
		t.Errorf("token %d after %d", le.Token(), taken.Token())
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaserComesBackToLapsedLease: when the lease the release handed
// out has run out by the time the releaser comes back (though past the
// release's clock), the releaser's first attempt takes the lock for held,
// as rewait.lua says: it is refused and recorded, told the lease had the
// little left it had at the release, and comes back then to take the
// lock, well before a lost wake-up's quarter TTL.
func TestReleaserComesBackToLapsedLease(t *testing.T) {
	admin, addr := privateClient(t)
	// A long waiter timeout makes the window of the release's clock (a
	// sixteenth of it) long enough for any load.
	a := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}), WithWaiterTimeout(10*time.Minute))
	b := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	ctx := context.Background()
	const key, short = "comes-back-lapsed", 50 * time.Millisecond
	first, err := a.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Owner: "a"})
	if err != nil {
		t.Fatal(err)
	}
	gotB := make(chan driver.Lease, 1)
	go func() {
		le, err := b.Acquire(ctx, key, driver.AcquireOptions{TTL: short, Wait: true, Owner: "b"})
		if err != nil {
			t.Errorf("b: %v", err)
		}
		gotB <- le
	}()
	eventually(t, "b recorded", func() bool {
		n, _ := admin.ZCard(ctx, mutexNamesOf(key).waiters).Result()
		return n == 1
	})
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lapsed := <-gotB
	if lapsed == nil {
		t.FailNow()
	}
	// b's lease runs out; a comes back within the window of the release's
	// clock.
	time.Sleep(3 * short)
	if h := a.handedOff.Load(); h == nil || time.Since(h.at) > a.cfg.waiterTimeout/32 {
		t.Fatalf("the release's handoff %+v, or too long ago for this test", h)
	}
	before := serverCalls(t, admin)
	start := time.Now()
	le, err := a.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Owner: "a"})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if n := delta(before, serverCalls(t, admin))["zadd"]; n != 1 {
		t.Errorf("%d records written, want 1: the first attempt took the lapsed lease for held and recorded a", n)
	}
	if took > time.Second {
		t.Errorf("the lapsed lease took %v to take", took)
	}
	if le.Token() <= lapsed.Token() {
		t.Errorf("token %d after %d", le.Token(), lapsed.Token())
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaserComesBackToUnflaggedHolder: when the lock changed hands
// twice before the releaser came back, and its holder's grant found nobody
// waiting (so that its release will look for no waiter), the releaser's
// first attempt must not record itself without raising the flag: the
// holder's release would free the lock without a word to it. Its Locker is
// already listening (for another key), so that no attempt after a new
// subscription raises the flag in its place.
func TestReleaserComesBackToUnflaggedHolder(t *testing.T) {
	admin, addr := privateClient(t)
	newL := func(opts ...Option) *Locker {
		return newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}), opts...)
	}
	// A long waiter timeout makes the window of the release's clock (a
	// sixteenth of it) long enough for any load.
	a, b, x, y := newL(WithWaiterTimeout(10*time.Minute)), newL(), newL(), newL()
	ctx := context.Background()
	const key, other = "comes-back-unflagged", "comes-back-unflagged-other"
	opts := func(owner string, wait bool) driver.AcquireOptions {
		return driver.AcquireOptions{TTL: 10 * time.Second, Wait: wait, Owner: owner}
	}
	first, err := a.Acquire(ctx, key, opts("a", true))
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := y.Acquire(ctx, other, opts("y", false))
	if err != nil {
		t.Fatal(err)
	}
	gotOther := waitFor(t, admin, a, other, "a", 1)
	gotB := waitFor(t, admin, b, key, "b", 1)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	byB := <-gotB
	if byB == nil {
		t.FailNow()
	}
	if err := byB.Release(ctx); err != nil {
		t.Fatal(err)
	}
	byX, err := x.Acquire(ctx, key, opts("x", false))
	if err != nil {
		t.Fatalf("x on the free lock: %v", err)
	}
	if h := a.handedOff.Load(); h == nil || time.Since(h.at) > a.cfg.waiterTimeout/32 {
		t.Fatalf("the release's handoff %+v, or too long ago for this test", h)
	}
	backA := make(chan driver.Lease, 1)
	go func() {
		le, err := a.Acquire(ctx, key, opts("a", true))
		if err != nil {
			t.Errorf("a again: %v", err)
		}
		backA <- le
	}()
	eventually(t, "a recorded", func() bool {
		n, _ := admin.ZCard(ctx, mutexNamesOf(key).waiters).Result()
		return n == 1
	})
	released := time.Now()
	if err := byX.Release(ctx); err != nil {
		t.Fatal(err)
	}
	le := <-backA
	if le == nil {
		t.FailNow()
	}
	// A lost wake-up costs the waiter a keep-alive: seconds.
	if took := time.Since(released); took > time.Second {
		t.Errorf("a got the lock %v after x's release", took)
	}
	if le.Token() <= byX.Token() {
		t.Errorf("token %d after %d", le.Token(), byX.Token())
	}
	for _, l := range []driver.Lease{le, blocker} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if l := <-gotOther; l == nil {
		t.FailNow()
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLabelWithSeparatorsReleased: a holder whose label looks like the
// state's own fields (":0:1:", a newline) is released on the slow path,
// where the script parses owner, token and day back out of the tail the
// client packed: a waiter that raised the flag after the grant is handed
// the lock, and Inspect shows the label as it was given.
func TestLabelWithSeparatorsReleased(t *testing.T) {
	admin, addr := privateClient(t)
	a := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	b := newLocker(t, goredis.NewClient(&goredis.Options{Addr: addr}))
	ctx := context.Background()
	const key, label = "label-separators", "x:0:1:\n0:"
	held, err := a.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second, Owner: label})
	if err != nil {
		t.Fatal(err)
	}
	if ls := held.(*lease); ls.waiting != 0 {
		t.Fatalf("the grant found waiting flag %d, want 0 (its release packs owner, token and day)", ls.waiting)
	}
	in, err := a.Inspect(ctx, key)
	if err != nil || len(in.Holders) != 1 || in.Holders[0].Owner != label {
		t.Fatalf("Inspect: %+v, %v; want the holder labelled %q", in, err, label)
	}
	gotB := waitFor(t, admin, b, key, "b", 1)
	if err := held.Release(ctx); err != nil {
		t.Fatalf("the release on the slow path: %v", err)
	}
	le := <-gotB
	if le == nil {
		t.FailNow()
	}
	if le.Token() <= held.Token() {
		t.Errorf("token %d after %d", le.Token(), held.Token())
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

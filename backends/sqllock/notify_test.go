package sqllock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

const (
	// slowPoll is every backoff pause of the waiters in these tests, from
	// the first: a waiter that gets the lock within handoffDeadline of its
	// release was woken, it did not poll.
	slowPoll        = 30 * time.Second
	handoffDeadline = 5 * time.Second
	// notifyTable keeps the test that kills listener connections to
	// listeners of its own.
	notifyTable = "warden_notify_test"
)

func postgresDB() database { return databaseNamed("postgres") }

func mariaDB() database { return databaseNamed("mariadb") }

func databaseNamed(name string) database {
	for _, db := range databases() {
		if db.name == name {
			return db
		}
	}
	panic("no " + name + " in databases()")
}

// slowWaiter is a Locker whose waits poll only every slowPoll.
func slowWaiter(t testing.TB, g *gorm.DB, opts ...sqllock.Option) *sqllock.Locker {
	l := newLocker(t, g, append(opts, sqllock.WithMaxBackoff(slowPoll))...)
	sqllock.SetMinPause(l, slowPoll)
	return l
}

// eventually waits, up to a deadline, for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type result struct {
	lease driver.Lease
	err   error
}

// waitFor starts a waiting Acquire of key on l and returns where its result
// will arrive, once l has registered the Acquire as waiting and the Acquire
// has marked the lock as waited for, so that its release notifies.
func waitFor(t testing.TB, ctx context.Context, l *sqllock.Locker, key string) <-chan result {
	t.Helper()
	out := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true})
		out <- result{lease, err}
	}()
	eventually(t, "the Acquire to wait", func() bool { return sqllock.Waiters(l, key) > 0 && sqllock.WaitedFor(l, key) })
	return out
}

// warmUp makes l's listener run, by waiting on a key holder holds, so that a
// later wait joins a listener that is already LISTENing: the wake-up every
// waiter gets when listening starts is then over, and only a notification can
// end a slowPoll pause early.
func warmUp(t testing.TB, l, holder *sqllock.Locker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k := uniqueKey(t) + "/warm"
	lease, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	out := waitFor(t, ctx, l, k)
	eventually(t, "the listener to listen", func() bool { l, _, _ := sqllock.ListenStats(l); return l > 0 })
	cancel()
	if r := <-out; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("warm-up wait: %v, want context.Canceled", r.err)
	}
}

// handedOver releases lease and requires the waiter behind out to get the
// lock within handoffDeadline, far below its slowPoll pause.
func handedOver(t testing.TB, lease driver.Lease, out <-chan result) driver.Lease {
	t.Helper()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case r := <-out:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		return r.lease
	case <-time.After(handoffDeadline):
		t.Fatalf("the waiter did not get the lock within %v of its release; it polls every %v", handoffDeadline, slowPoll)
		return nil
	}
}

// awaited has holder take a fresh key and waiter wait for it, for up to a
// minute: it returns the holder's lease and where the waiter's result will
// arrive.
func awaited(t *testing.T, holder, waiter *sqllock.Locker) (driver.Lease, <-chan result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	k := uniqueKey(t)
	lease, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return lease, waitFor(t, ctx, waiter, k)
}

// TestNotifyHandoff: on PostgreSQL a release wakes a waiter of another
// process at once, although the waiter's next poll is at least 15s away.
func TestNotifyHandoff(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	holder := newLocker(t, migrated(t, db, dsn))
	waiter := slowWaiter(t, openDB(t, db, dsn))
	warmUp(t, waiter, holder)
	lease, out := awaited(t, holder, waiter)
	_, _, before := sqllock.ListenStats(waiter)
	got := handedOver(t, lease, out)
	defer got.Release(context.Background())
	if got.Token() <= lease.Token() {
		t.Errorf("token %d after the holder's %d", got.Token(), lease.Token())
	}
	if _, _, after := sqllock.ListenStats(waiter); after <= before {
		t.Errorf("no waiter woken by a notification (%d before, %d after)", before, after)
	}
}

// TestNotifyChain: several waiters of one Locker on one key get the lock in
// turn, each woken by the release of the one before, one wake-up per release.
func TestNotifyChain(t *testing.T) {
	const n = 4
	db := postgresDB()
	dsn := db.dsn(t)
	holder := newLocker(t, migrated(t, db, dsn))
	waiter := slowWaiter(t, openDB(t, db, dsn))
	warmUp(t, waiter, holder)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	k := uniqueKey(t)
	lease, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, n)
	for i := range n {
		go func() {
			lease, err := waiter.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
			out <- result{lease, err}
		}()
		eventually(t, "the Acquire to wait", func() bool { return sqllock.Waiters(waiter, k) == i+1 })
	}
	eventually(t, "the lock marked as waited for", func() bool { return sqllock.WaitedFor(waiter, k) })
	_, _, before := sqllock.ListenStats(waiter)
	for i := range n {
		lease = handedOver(t, lease, out)
		if left := sqllock.Waiters(waiter, k); left != n-1-i {
			t.Fatalf("after handoff %d: %d waiters left, want %d", i+1, left, n-1-i)
		}
	}
	lease.Release(context.Background())
	if _, _, after := sqllock.ListenStats(waiter); after-before != n {
		t.Errorf("%d releases woke %d waiters", n, after-before)
	}
}

// TestNotifyListenerLost kills the listener's connection while a waiter
// waits and releases the lock while the listener may still be down, so that
// its notification is lost: the listener reconnects, and on reconnecting
// wakes the waiter, which finds the lock free long before its next poll.
func TestNotifyListenerLost(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	opts := []sqllock.Option{sqllock.WithTable(notifyTable)}
	admin := migrated(t, db, dsn, opts...)
	holder := newLocker(t, admin, opts...)
	waiter := slowWaiter(t, openDB(t, db, dsn), opts...)
	warmUp(t, waiter, holder)
	lease, out := awaited(t, holder, waiter)
	listens, _, _ := sqllock.ListenStats(waiter)
	var killed int64
	err := admin.Raw("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = ?",
		`LISTEN "`+sqllock.Channel(waiter)+`"`).Row().Scan(&killed)
	if err != nil || killed == 0 {
		t.Fatalf("terminate the listener: %d killed, %v", killed, err)
	}
	eventually(t, "the listener to notice", func() bool { _, d, _ := sqllock.ListenStats(waiter); return d > 0 })
	got := handedOver(t, lease, out)
	defer got.Release(context.Background())
	eventually(t, "the listener to reconnect", func() bool { l, _, _ := sqllock.ListenStats(waiter); return l > listens })
	_, _, woken := sqllock.ListenStats(waiter)
	t.Logf("handed over after the listener was killed; notification wake-ups: %d", woken)
}

// TestWithoutNotify: the option leaves PostgreSQL Lockers polling, and they
// still hand over (at the poll).
func TestWithoutNotify(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	holder := newLocker(t, migrated(t, db, dsn), sqllock.WithoutNotify())
	waiter := newLocker(t, openDB(t, db, dsn), sqllock.WithoutNotify())
	if ch := sqllock.Channel(waiter); ch != "" {
		t.Fatalf("channel %q with WithoutNotify", ch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := uniqueKey(t)
	lease, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
		out <- result{lease, err}
	}()
	time.Sleep(50 * time.Millisecond)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.lease.Release(ctx)
	if listens, _, _ := sqllock.ListenStats(waiter); listens != 0 {
		t.Errorf("%d listens with WithoutNotify", listens)
	}
}

// hotPair returns a holder whose own listener runs (it waited lately, so its
// releases are announced a moment after the fact) and a slow-polling waiter
// whose listener runs too.
func hotPair(t *testing.T) (holder, waiter *sqllock.Locker) {
	t.Helper()
	db := postgresDB()
	dsn := db.dsn(t)
	holder = newLocker(t, migrated(t, db, dsn))
	waiter = slowWaiter(t, openDB(t, db, dsn))
	warmUp(t, holder, waiter)
	warmUp(t, waiter, holder)
	return holder, waiter
}

// TestDeferredAnnouncement: a release by a Locker that had waiters lately is
// announced a moment later, and wakes a waiter of another process.
func TestDeferredAnnouncement(t *testing.T) {
	holder, waiter := hotPair(t)
	lease, out := awaited(t, holder, waiter)
	handedOver(t, lease, out).Release(context.Background())
}

// TestTakenBackIsNotAnnounced: a holder that takes the lock back at once
// wakes nobody; its next release, not taken back, is announced.
func TestTakenBackIsNotAnnounced(t *testing.T) {
	holder, waiter := hotPair(t)
	sqllock.SetAnnounceDelay(holder, 300*time.Millisecond)
	lease, out := awaited(t, holder, waiter)
	ctx := context.Background()
	_, _, before := sqllock.ListenStats(waiter)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err := holder.Acquire(ctx, sqllock.LeaseKey(lease), driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("taking the lock back: %v", err)
	}
	time.Sleep(600 * time.Millisecond)
	if _, _, after := sqllock.ListenStats(waiter); after != before {
		t.Errorf("a release taken back woke %d waiters", after-before)
	}
	handedOver(t, lease, out).Release(ctx)
}

// TestCloseAnnounces: Close sends the announcements still deferred, so that
// a process that releases and shuts down leaves no waiter to its next poll.
func TestCloseAnnounces(t *testing.T) {
	holder, waiter := hotPair(t)
	sqllock.SetAnnounceDelay(holder, time.Hour)
	lease, out := awaited(t, holder, waiter)
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	holder.Close()
	select {
	case r := <-out:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		r.lease.Release(context.Background())
	case <-time.After(handoffDeadline):
		t.Fatalf("the waiter did not get the lock within %v of the holder's Close", handoffDeadline)
	}
}

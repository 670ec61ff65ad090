package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/backends/sqllock/pglisten"
	"github.com/warden-go/warden/guard/driver"
)

// heard counts the notifications on a channel by payload.
type heard struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *heard) note(payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n[payload]++
}

func (h *heard) count(payload string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[payload]
}

// listen LISTENs on channel from a connection of its own until t ends, and
// returns once the LISTEN took effect.
func listen(t *testing.T, channel string) *heard {
	t.Helper()
	db := postgresDB()
	pool, err := openDB(t, db, db.dsn(t)).DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pool.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := &heard{n: map[string]int{}}
	listening := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		pglisten.Listener{}.Listen(ctx, conn, channel, func() { close(listening) }, h.note)
	}()
	t.Cleanup(func() { cancel(); <-done; conn.Close() })
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		t.Fatal("the LISTEN did not take effect")
	}
	return h
}

// TestReleaseNotifiesOnlyWhenWaited: on PostgreSQL, a release notifies
// the table's channel only when a waiter that listens marked the lock as
// waited for: uncontended cycles send no NOTIFY, whose commit PostgreSQL
// serialises with every other notifying one; a release that a waiter
// awaits wakes it at once.
func TestReleaseNotifiesOnlyWhenWaited(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	holder := newLocker(t, migrated(t, db, dsn))
	h := listen(t, sqllock.Channel(holder))
	admin := openDB(t, db, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	alone := uniqueKey(t) + "/alone"
	for range 20 {
		lease, err := holder.Acquire(ctx, alone, driver.AcquireOptions{TTL: time.Minute, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Notifications arrive in commit order: once this one is heard, any
	// the cycles sent have been too.
	const sentinel = "sentinel"
	if err := admin.Exec("SELECT pg_notify(?, ?)", sqllock.Channel(holder), sentinel).Error; err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sentinel notification", func() bool { return h.count(sentinel) > 0 })
	if n := h.count(alone); n != 0 {
		t.Errorf("20 uncontended cycles sent %d notifications, want none", n)
	}

	waiter := slowWaiter(t, openDB(t, db, dsn))
	warmUp(t, waiter, holder)
	lease, out := awaited(t, holder, waiter)
	got := handedOver(t, lease, out)
	// This connection may hear it after the waiter's listener did.
	eventually(t, "the notification of a release a waiter awaited", func() bool { return h.count(sqllock.LeaseKey(lease)) > 0 })
	got.Release(ctx)
}

// TestMigrateAddsWaitingColumn: a lock table of an earlier version, without
// the waiting_until column, gets it from Migrate with its rows and their
// tokens kept, and statements of the earlier version, which do not name
// the column, keep working on the migrated table beside this version's.
func TestMigrateAddsWaitingColumn(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			g := openDB(t, db, db.dsn(t))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			table := fmt.Sprintf("warden_test_nowait_%d", time.Now().UnixNano())
			key := "varchar(255)"
			if db.name == "mariadb" {
				key = "varbinary(255)"
			}
			earlierTable(t, g, table, key, "")
			l := newLocker(t, g, sqllock.WithTable(table))
			if err := l.Migrate(ctx); err != nil {
				t.Fatalf("Migrate over the earlier table: %v", err)
			}
			if !g.Migrator().HasColumn(table, "waiting_until") {
				t.Fatal("no waiting_until column after Migrate")
			}
			if err := l.Migrate(ctx); err != nil {
				t.Fatalf("second Migrate: %v", err)
			}
			// The earlier version's acquire inserts rows without naming
			// the column.
			if err := g.Exec("INSERT INTO " + table + " (name, owner, version, lock_until, locked_at) VALUES ('e', 'earlier', 7, 0, 0)").Error; err != nil {
				t.Fatalf("an earlier version's insert on the migrated table: %v", err)
			}
			for _, k := range []string{"k", "e", "new"} {
				lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
				if err != nil {
					t.Fatalf("Acquire(%s): %v", k, err)
				}
				if k == "k" && lease.Token() <= 41 {
					t.Errorf("token of k after the migration: %d, not above the earlier row's 41", lease.Token())
				}
				if err := lease.Release(ctx); err != nil {
					t.Errorf("Release(%s): %v", k, err)
				}
			}
		})
	}
}

// earlierTable creates table as earlier versions did, with a name column of
// keyType and the table options given, holding an expired lock of key "k"
// at token 41, whose token must survive a migration; it is dropped when t
// ends.
func earlierTable(t *testing.T, g *gorm.DB, table, keyType, options string) {
	t.Helper()
	earlier := "CREATE TABLE " + table + " (name " + keyType + ` NOT NULL PRIMARY KEY,
		owner varchar(255) NOT NULL,
		version bigint NOT NULL,
		lock_until bigint NOT NULL,
		locked_at bigint NOT NULL)` + options
	if err := g.Exec(earlier).Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Exec("DROP TABLE IF EXISTS " + table) })
	if err := g.Exec("INSERT INTO " + table + " VALUES ('k', 'earlier', 41, 0, 0)").Error; err != nil {
		t.Fatal(err)
	}
}

// TestEarlierTableUnmigrated: on PostgreSQL, a Locker on a table of an
// earlier version that Migrate has not seen acquires a free key (its first
// attempt names no waiting_until) and releases it, the release falling back
// to the statement without the column, whether its listener is idle or
// runs; a waiting Acquire, whose marking attempt needs the column, fails at
// once with an ErrInvalidOption that names the column and the fix, rather
// than retrying until its context ends. A Locker WithoutNotify works on it
// throughout.
func TestEarlierTableUnmigrated(t *testing.T) {
	db := postgresDB()
	g := openDB(t, db, db.dsn(t))
	table := fmt.Sprintf("warden_test_unmigrated_%d", time.Now().UnixNano())
	earlierTable(t, g, table, "varchar(255)", "")
	l := newLocker(t, g, sqllock.WithTable(table))
	const bound = 5 * time.Second // well within the calls' minute
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()

	free := uniqueKey(t)
	lease, err := l.Acquire(ctx, free, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire of a free key: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release with the listener idle: %v", err)
	}
	again, err := l.Acquire(ctx, free, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire after the release: %v (not released)", err)
	}

	waitStart := time.Now()
	_, err = l.Acquire(ctx, free, driver.AcquireOptions{TTL: time.Minute, Wait: true})
	if took := time.Since(waitStart); took > bound {
		t.Errorf("waiting Acquire failed after %v, want within %v", took, bound)
	}
	if !errors.Is(err, driver.ErrInvalidOption) || errors.Is(err, driver.ErrUnavailable) ||
		!strings.Contains(err.Error(), "waiting_until") || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("waiting Acquire: %v, want an ErrInvalidOption, not ErrUnavailable, naming waiting_until and Migrate", err)
	}
	// The waiter started the listener, so this release takes the path of
	// a Locker with waiters lately.
	if !sqllock.Hot(l) {
		t.Error("the listener does not run after the waiting Acquire")
	}
	if err := again.Release(ctx); err != nil {
		t.Errorf("Release with the listener running: %v", err)
	}
	if _, err := l.Acquire(ctx, free, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Errorf("Acquire after the second release: %v (not released)", err)
	}
	if took := time.Since(start); took > 3*bound {
		t.Errorf("took %v", took)
	}

	// A Locker WithoutNotify names no waiting_until: its waiting Acquire
	// polls until its context ends, and its release works.
	quiet := newLocker(t, g, sqllock.WithTable(table), sqllock.WithoutNotify())
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := quiet.Acquire(short, free, driver.AcquireOptions{TTL: time.Minute, Wait: true}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting Acquire WithoutNotify: %v, want its context's deadline", err)
	}
	other, err := quiet.Acquire(ctx, uniqueKey(t), driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire WithoutNotify: %v", err)
	}
	if err := other.Release(ctx); err != nil {
		t.Errorf("Release WithoutNotify: %v", err)
	}
}

// TestLastingMarkTakesNoRowLock: on PostgreSQL, the attempt of a waiter that
// listens, on a lock held and already marked as waited for longer than the
// waiter's next pause, reads the row without locking it, so it does not
// queue behind the holder's statements (here a transaction holding the row
// lock); one whose pause outlasts the mark writes the mark, under the row
// lock, and so waits for it. So for both kinds of attempt: the one after a
// notification, which may take the lock (Attempt), and the one after a
// pause, which reads the row first (Poll).
func TestLastingMarkTakesNoRowLock(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	holder := newLocker(t, migrated(t, db, dsn))
	waiter := newLocker(t, openDB(t, db, dsn))
	for _, kind := range []struct {
		name    string
		attempt func(context.Context, *sqllock.Locker, string, time.Duration, time.Duration) (bool, time.Duration, error)
	}{{"notified", sqllock.Attempt}, {"polling", sqllock.Poll}} {
		t.Run(kind.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			key := uniqueKey(t)
			lease, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			// Marks the row for twice 10s.
			taken, left, err := kind.attempt(ctx, waiter, key, time.Minute, 10*time.Second)
			if err != nil || taken || left < 30*time.Second {
				t.Fatalf("marking attempt: taken %v, left %v, err %v; want held with about a minute left", taken, left, err)
			}
			if !sqllock.WaitedFor(waiter, key) {
				t.Fatal("the row is not marked as waited for")
			}
			tx := openDB(t, db, dsn).Begin()
			defer tx.Rollback()
			if err := tx.Exec("SELECT 1 FROM "+sqllock.DefaultTable+" WHERE name = ? FOR UPDATE", key).Error; err != nil {
				t.Fatal(err)
			}

			short, stop := context.WithTimeout(ctx, 5*time.Second)
			taken, left, err = kind.attempt(short, waiter, key, time.Minute, time.Second)
			stop()
			if err != nil || taken || left < 30*time.Second {
				t.Fatalf("attempt within the mark: taken %v, left %v, err %v; want held with about a minute left, without waiting for the row lock", taken, left, err)
			}
			short, stop = context.WithTimeout(ctx, 300*time.Millisecond)
			taken, _, err = kind.attempt(short, waiter, key, time.Minute, 30*time.Second)
			stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("attempt past the mark: taken %v, err %v; want it waiting for the row lock until its deadline", taken, err)
			}
		})
	}
}

// TestPollTakesFreeLock: a waiter's attempt after a pause with no
// notification (Poll), which reads the row before anything else, still
// takes a lock that is free: released, never taken (no row), or whose
// lease ran out; and it takes none that is held.
func TestPollTakesFreeLock(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	holder := newLocker(t, migrated(t, db, dsn))
	waiter := newLocker(t, openDB(t, db, dsn))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	poll := func(key string) bool {
		t.Helper()
		taken, _, err := sqllock.Poll(ctx, waiter, key, time.Minute, 10*time.Millisecond)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		return taken
	}

	if !poll(uniqueKey(t) + "/new") {
		t.Error("a key never locked was not taken")
	}

	released := uniqueKey(t) + "/released"
	lease, err := holder.Acquire(ctx, released, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if poll(released) {
		t.Fatal("a held lock was taken")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !poll(released) {
		t.Error("a released lock was not taken")
	}

	expired := uniqueKey(t) + "/expired"
	if _, err := holder.Acquire(ctx, expired, driver.AcquireOptions{TTL: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// Marked while held, for twice the pause.
	if poll(expired) {
		t.Fatal("a held lock was taken")
	}
	time.Sleep(300 * time.Millisecond)
	if !poll(expired) {
		t.Error("a lock whose lease ran out was not taken")
	}
}

// TestPollLostAnswerGivesNothingBack: an attempt after a pause whose read
// or mark lost its answer (here its ctx ended before it was sent) starts no
// give-back, since neither statement can take the lock; the attempt that
// can does.
func TestPollLostAnswerGivesNothingBack(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	holder := newLocker(t, migrated(t, db, dsn))
	waiter := newLocker(t, openDB(t, db, dsn))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := uniqueKey(t)
	lease, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	ended, end := context.WithCancel(ctx)
	end()
	if _, _, err := sqllock.Poll(ended, waiter, key, time.Minute, time.Second); err == nil {
		t.Fatal("Poll with an ended ctx: no error")
	}
	if n := sqllock.GivingBack(waiter); n != 0 {
		t.Errorf("%d give-backs after a lost read, want none", n)
	}
	if _, _, err := sqllock.Attempt(ended, waiter, key, time.Minute, time.Second); err == nil {
		t.Fatal("Attempt with an ended ctx: no error")
	}
	if n := sqllock.GivingBack(waiter); n != 1 {
		t.Errorf("%d give-backs after a lost attempt that could take the lock, want 1", n)
	}
}

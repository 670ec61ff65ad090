package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestGrantAfterARowLock: a waiting acquisition whose statement waits on
// the lock row for another transaction (one bound to its caller's
// transaction, SELECT … FOR UPDATE) longer than the TTL is granted a lease
// that has already run out: PostgreSQL reads the clock that counts it
// before the statement waits. guard gives it back and waits again, within
// its bound, and the caller holds the lock.
func TestGrantAfterARowLock(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	admin := migrated(t, db, dsn)
	app := fmt.Sprintf("warden_late_grant_%d", time.Now().UnixNano())
	const ttl = time.Second
	var log drivertest.LogBuffer
	g, err := guard.New(newLocker(t, openDB(t, db, dsn+"&application_name="+app)), guard.WithTTL(ttl),
		guard.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	if err != nil {
		t.Fatal(err)
	}
	other := newLocker(t, admin)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := uniqueKey(t)
	// The row exists, free.
	l, err := g.Lock(ctx, key, guard.NoWait())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	blocker := openDB(t, db, dsn).Begin()
	defer blocker.Rollback()
	var n int64
	if err := blocker.Raw(`SELECT count(*) FROM (SELECT 1 FROM `+sqllock.DefaultTable+` WHERE name = ? FOR UPDATE) s`, "warden:"+key).Scan(&n).Error; err != nil || n != 1 {
		t.Fatalf("locking the row: %d rows, %v", n, err)
	}
	type result struct {
		l   *guard.Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := g.Lock(ctx, key, guard.WaitAtMost(30*time.Second))
		done <- result{l, err}
	}()
	eventually(t, "the acquisition's statement waiting on the row lock", func() bool {
		var waiting int64
		admin.Raw("SELECT count(*) FROM pg_stat_activity WHERE application_name = ? AND wait_event_type = 'Lock'", app).Scan(&waiting)
		return waiting > 0
	})
	// The row lock is held past the TTL: the scenario, not a wait for a
	// condition. The statement was sent before it was seen waiting, so
	// its lease runs out before the row is free.
	time.Sleep(ttl)
	if err := blocker.Commit().Error; err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Lock after a row lock held past the TTL: %v, want it held", r.err)
	}
	defer r.l.Unlock(ctx)
	if !strings.Contains(log.String(), "granted too late to be held") {
		t.Errorf("no late grant was given back: the row lock did not outlast the TTL? Log:\n%s", log.String())
	}
	if err := r.l.Context().Err(); err != nil {
		t.Errorf("the lock's context ended: %v (%v)", err, context.Cause(r.l.Context()))
	}
	if lease, err := other.Acquire(ctx, "warden:"+key, driver.AcquireOptions{TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
		if err == nil {
			lease.Release(ctx)
		}
		t.Errorf("another Locker's attempt on the held lock: %v, want ErrNotAcquired", err)
	}
}

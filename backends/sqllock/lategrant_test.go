package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// TestGrantAfterARowLock: a waiting acquisition whose statement waits on
// the lock row for another transaction (one bound to its caller's
// transaction, SELECT … FOR UPDATE) longer than the TTL is granted by
// PostgreSQL a lease counted from the grant, which sqllock counts from the
// statement's sending: too late to be held. guard gives it back and waits
// again, within its bound, and the caller holds the lock.
func TestGrantAfterARowLock(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	admin := migrated(t, db, dsn)
	app := fmt.Sprintf("warden_late_grant_%d", time.Now().UnixNano())
	const ttl = time.Second
	g, err := guard.New(newLocker(t, openDB(t, db, dsn+"&application_name="+app)), guard.WithTTL(ttl))
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
	// The statement was sent before it was seen waiting: its lease, as
	// sqllock counts it, runs out by the time the row is free.
	time.Sleep(ttl)
	if err := blocker.Commit().Error; err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Lock after a row lock held past the TTL: %v, want it held", r.err)
	}
	defer r.l.Unlock(ctx)
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

package sqllock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestBoundedByContext: a Locker declares itself bounded by its context
// only on pgx's database/sql driver, and there every call returns soon
// after its ctx ends even while its statement waits on the database: here
// for a row lock that another transaction keeps for longer than the test.
func TestBoundedByContext(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			l := newLocker(t, migrated(t, db, dsn))
			want := db.name == "postgres"
			if got := l.BoundedByContext(); got != want {
				t.Fatalf("BoundedByContext() = %v, want %v", got, want)
			}
			if !want {
				return
			}
			tx := openDB(t, db, dsn).Begin()
			t.Cleanup(func() { tx.Rollback() })
			if got := newLocker(t, tx).BoundedByContext(); got {
				t.Error("BoundedByContext() = true in a transaction, whose statements guard cannot see the driver of")
			}

			ctx := context.Background()
			key := uniqueKey(t)
			lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			blocker := openDB(t, db, dsn).Begin()
			t.Cleanup(func() { blocker.Rollback() })
			var n int64
			if err := blocker.Raw(`SELECT count(*) FROM (SELECT 1 FROM warden_locks WHERE name = ? FOR UPDATE) s`, key).Scan(&n).Error; err != nil || n != 1 {
				t.Fatalf("locking the row: %d rows, %v", n, err)
			}

			const bound, slack = 200 * time.Millisecond, 250 * time.Millisecond
			calls := []struct {
				name string
				call func(context.Context) error
			}{
				{"Acquire", func(ctx context.Context) error {
					_, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
					return err
				}},
				{"Refresh", func(ctx context.Context) error { return lease.Refresh(ctx, time.Minute) }},
				{"Release", func(ctx context.Context) error { return lease.Release(ctx) }},
			}
			for _, c := range calls {
				cctx, cancel := context.WithTimeout(ctx, bound)
				start := time.Now()
				err := c.call(cctx)
				took := time.Since(start)
				cancel()
				if !errors.Is(err, driver.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s on a locked row: %v, want ErrUnavailable or the ctx's error", c.name, err)
				}
				if took > bound+slack {
					t.Errorf("%s returned %v after its ctx's deadline of %v", c.name, took-bound, bound)
				}
			}
		})
	}
}

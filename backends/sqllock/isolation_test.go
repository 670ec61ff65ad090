package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// TestStricterIsolation runs contended locks and claims on PostgreSQL
// sessions whose transactions default to REPEATABLE READ or SERIALIZABLE,
// as a database or role may set (default_transaction_isolation): each
// statement is then refused (SQLSTATE 40001) when a row it updates was
// updated since its snapshot. That is a conflict the database resolved by
// running nothing, so the statement runs again; it never reaches the
// caller as the database being unavailable, a release that failed, a
// renewal that failed, or a claim that failed.
func TestStricterIsolation(t *testing.T) {
	db := databases()[1]
	dsn := db.dsn(t)
	migrated(t, db, dsn)
	store, err := sqllock.NewStore(openDB(t, db, dsn))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, level := range []string{"repeatable%20read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			strict := dsn + "&default_transaction_isolation=" + level
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			k := uniqueKey(t)
			var (
				wg     sync.WaitGroup
				mu     sync.Mutex
				failed []error
			)
			fail := func(err error) {
				mu.Lock()
				failed = append(failed, err)
				mu.Unlock()
			}
			for w := range 8 {
				l := newLocker(t, openDB(t, db, strict))
				st, err := sqllock.NewStore(openDB(t, db, strict))
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() {
					for i := range 40 {
						lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
						if errors.Is(err, driver.ErrNotAcquired) {
							continue
						}
						if err != nil {
							fail(fmt.Errorf("Acquire: %w", err))
							continue
						}
						if errs := l.RefreshBatch(ctx, []driver.Lease{lease}, time.Minute); errs[0] != nil {
							fail(fmt.Errorf("RefreshBatch: %w", errs[0]))
						}
						if err := lease.Refresh(ctx, time.Minute); err != nil {
							fail(fmt.Errorf("Refresh: %w", err))
						}
						if err := lease.Release(ctx); err != nil {
							fail(fmt.Errorf("Release: %w", err))
						}
						c := idempotency.Claim{Scope: k, Key: fmt.Sprint(i), Fingerprint: "f", Owner: fmt.Sprint(w), Lease: time.Minute}
						if _, err := st.Claim(ctx, c); err != nil {
							fail(fmt.Errorf("Claim: %w", err))
						}
					}
				})
			}
			wg.Wait()
			for i, err := range failed {
				if i == 5 {
					t.Errorf("and %d more", len(failed)-i)
					break
				}
				t.Error(err)
			}
		})
	}
}

// TestConflictInTransaction: a Locker bound to the caller's transaction
// does not run a statement again that the database refused for a
// serialization failure: the database aborted the whole transaction, which
// the statement alone cannot mend, and the caller, who retries its
// transactions on that error, is given it (SQLSTATE 40001), not the
// refusal of the statement run again in an aborted transaction (25P02).
// A waiting Acquire returns it at once too, rather than try again in the
// aborted transaction until its deadline.
func TestConflictInTransaction(t *testing.T) {
	db := databases()[1]
	dsn := db.dsn(t)
	g := migrated(t, db, dsn)
	other := newLocker(t, openDB(t, db, dsn))
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("Wait=%v", wait), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			k := uniqueKey(t)
			lease, err := other.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			tx := g.Begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
			defer tx.Rollback()
			// The transaction's snapshot, taken before another
			// acquisition updates the row.
			if err := tx.Exec("SELECT 1").Error; err != nil {
				t.Fatal(err)
			}
			if _, err := other.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			l, err := sqllock.New(tx)
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the other lease's end", func() bool {
				in, err := other.Inspect(ctx, k)
				return err == nil && len(in.Holders) == 0
			})
			_, err = l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: wait})
			var coded interface{ SQLState() string }
			if !errors.As(err, &coded) || coded.SQLState() != "40001" {
				t.Fatalf("Acquire in a transaction whose snapshot predates the row: %v, want the serialization failure (40001)", err)
			}
		})
	}
}

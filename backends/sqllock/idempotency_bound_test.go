package sqllock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// TestStoreUnansweredBounded: with pgx's defaults through database/sql, a
// request whose context has no deadline waits for the store no longer
// than the Executor's call timeout (and a scheduling margin) when the
// network black-holes the store, whether its claim lands with its answer
// lost or never gets there; the work does not run, and another process
// claims the key and runs it once, within the claim's lease.
func TestStoreUnansweredBounded(t *testing.T) {
	var pg database
	for _, db := range databases() {
		if db.name == "postgres" {
			pg = db
		}
	}
	for _, tc := range []struct {
		name string
		cut  func(*drivertest.Proxy)
	}{{"answers lost", (*drivertest.Proxy).LoseReplies}, {"cut off", (*drivertest.Proxy).Blackhole}} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := pg.dsn(t)
			direct, err := sqllock.NewStore(openDB(t, pg, dsn))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := direct.Migrate(ctx); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			holed, hole := proxied(t, dsn)
			st, err := sqllock.NewStore(openDB(t, pg, holed))
			if err != nil {
				t.Fatal(err)
			}
			const bound, lease, margin = time.Second, 3 * time.Second, 250 * time.Millisecond
			e, err := idempotency.New(st, idempotency.WithCallTimeout(bound), idempotency.WithLease(lease))
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("done"), nil }
			if _, err := e.Do(ctx, uniqueKey(t)+"/warm", "fp", fn); err != nil {
				t.Fatalf("Do before the cut: %v", err)
			}
			runs.Store(0)
			k := uniqueKey(t)
			tc.cut(hole)
			start := time.Now()
			_, err = e.Do(ctx, k, "fp", fn)
			took := time.Since(start)
			if !errors.Is(err, idempotency.ErrUnavailable) || took > bound+margin {
				t.Fatalf("Do through the black hole: %v after %v, want ErrUnavailable within %v", err, took, bound+margin)
			}
			if runs.Load() != 0 {
				t.Fatal("the work ran without an answered claim")
			}
			other, err := idempotency.New(direct, idempotency.WithLease(lease))
			if err != nil {
				t.Fatal(err)
			}
			for {
				_, err := other.Do(ctx, k, "fp", fn)
				if err == nil {
					break
				}
				if !errors.Is(err, idempotency.ErrInProgress) || time.Since(start) > lease+2*time.Second {
					t.Fatalf("the other process after %v: %v, want the key claimable within the %v lease", time.Since(start), err, lease)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("Do returned after %v; the other process ran the work %v after the cut", took, time.Since(start))
			if n := runs.Load(); n != 1 {
				t.Errorf("the work ran %d times, want once", n)
			}
		})
	}
}

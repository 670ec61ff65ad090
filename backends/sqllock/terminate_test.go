package sqllock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestTerminatedConnections: after PostgreSQL terminates a Locker's idle
// connections (pg_terminate_backend, as an administrator, a pooler's
// restart or a failover's fencing does), the next acquisition, renewal and
// release each succeed: the first statement on such a connection is
// answered by the server's FATAL (SQLSTATE 57P01) that it left behind, and
// ran nowhere, so it runs again on another connection. A release reported
// failed would leave the lock taken until its TTL ran out.
func TestTerminatedConnections(t *testing.T) {
	db := databases()[1]
	dsn := db.dsn(t)
	admin := migrated(t, db, dsn)
	app := fmt.Sprintf("warden_terminated_%d", time.Now().UnixNano())
	g := openDB(t, db, dsn+"&application_name="+app)
	pool, err := g.DB()
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	terminate := func() {
		t.Helper()
		// An idle connection to terminate, whatever the last call left.
		if err := pool.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		var n int64
		err := admin.Raw("SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ?) AS s", app).Scan(&n).Error
		if err != nil || n == 0 {
			t.Fatalf("terminated %d connections: %v", n, err)
		}
		// The backends are gone once pg_stat_activity no longer lists them.
		eventually(t, "the terminated backends' exit", func() bool {
			admin.Raw("SELECT count(*) FROM pg_stat_activity WHERE application_name = ?", app).Scan(&n)
			return n == 0
		})
	}
	for i := range 5 {
		k := uniqueKey(t)
		lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatalf("round %d: Acquire: %v", i, err)
		}
		terminate()
		if err := lease.Refresh(ctx, time.Minute); err != nil {
			t.Errorf("round %d: Refresh after the connections were terminated: %v", i, err)
		}
		terminate()
		if errs := l.RefreshBatch(ctx, []driver.Lease{lease}, time.Minute); errs[0] != nil {
			t.Errorf("round %d: RefreshBatch after the connections were terminated: %v", i, errs[0])
		}
		terminate()
		if err := lease.Release(ctx); err != nil {
			t.Errorf("round %d: Release after the connections were terminated: %v", i, err)
		}
		terminate()
		if lease, err = l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatalf("round %d: Acquire after the connections were terminated: %v", i, err)
		}
		terminate()
		if err := lease.Release(ctx); err != nil {
			t.Errorf("round %d: Release after the connections were terminated: %v", i, err)
		}
	}
}

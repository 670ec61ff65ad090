package sqllock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// TestLockTimeout: with a lock_timeout on the session (a role's or a
// database's setting), a release that waits on its row's lock longer,
// behind another transaction, as behind a batch renewal of many rows, runs
// again rather than fail and leave the lock taken until its TTL. PostgreSQL
// refuses the statement (SQLSTATE 55P03) having run nothing, as MySQL does
// its lock wait timeout.
func TestLockTimeout(t *testing.T) {
	db := databases()[1]
	dsn := db.dsn(t)
	admin := migrated(t, db, dsn)
	app := fmt.Sprintf("warden_lock_timeout_%d", time.Now().UnixNano())
	l := newLocker(t, openDB(t, db, dsn+"&lock_timeout=200&application_name="+app))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := uniqueKey(t)
	lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Another transaction holds the row's lock.
	tx := admin.Begin()
	defer tx.Rollback()
	if err := tx.Exec("UPDATE "+sqllock.DefaultTable+" SET waiting_until = waiting_until WHERE name = ?", k).Error; err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctx) }()
	// Until the release's first attempt has timed out and a second waits,
	// or the release has returned.
	var first time.Time
	var err2 error
	done := false
	eventually(t, "a second attempt of the release waiting on the row lock", func() bool {
		select {
		case err2 = <-released:
			done = true
			return true
		default:
		}
		var started []time.Time
		admin.Raw("SELECT query_start FROM pg_stat_activity WHERE application_name = ? AND wait_event_type = 'Lock'", app).Scan(&started)
		if len(started) == 0 {
			return false
		}
		if first.IsZero() {
			first = started[0]
		}
		return !started[0].Equal(first)
	})
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if !done {
		err2 = <-released
	}
	if err2 != nil {
		t.Fatalf("Release behind another transaction's row lock, past lock_timeout: %v", err2)
	}
}

package sqllock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// TestMigrateQualifiedTable: on MariaDB, a lock table in another database
// (WithTable("db.table")) is migrated again without error, as a restarted
// process does, and a column it lacks is added. gorm's MySQL migrator looks
// a table up in the connection's own database, whatever its qualifier, and
// so tried to create it again.
func TestMigrateQualifiedTable(t *testing.T) {
	db := databases()[2]
	g := openDB(t, db, db.dsn(t))
	other := fmt.Sprintf("warden_other_%d", time.Now().UnixNano())
	if err := g.Exec("CREATE DATABASE " + other).Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Exec("DROP DATABASE " + other) })
	table := other + ".locks"
	l := newLocker(t, g, sqllock.WithTable(table))
	ctx := context.Background()
	for i := range 2 {
		if err := l.Migrate(ctx); err != nil {
			t.Fatalf("Migrate %d: %v", i+1, err)
		}
	}
	if err := g.Exec("ALTER TABLE " + table + " DROP COLUMN waiting_until").Error; err != nil {
		t.Fatal(err)
	}
	if err := l.Migrate(ctx); err != nil {
		t.Fatalf("Migrate of a table without waiting_until: %v", err)
	}
	var n int64
	g.Raw("SELECT count(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'locks' AND COLUMN_NAME = 'waiting_until'", other).Scan(&n)
	if n != 1 {
		t.Fatalf("Migrate did not add waiting_until")
	}
	lease, err := l.Acquire(ctx, uniqueKey(t), driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

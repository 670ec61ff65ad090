package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// TestMigrateAsRowWriter: on PostgreSQL, Migrate on tables that are up to
// date changes nothing, so that a service whose role may read and write
// the rows, and not alter the tables it does not own, starts: it set the
// lock table's fillfactor at every run, which only the owner may. A
// fillfactor another changed is set again, by the owner.
func TestMigrateAsRowWriter(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	table := fmt.Sprintf("rowwriter_%d", time.Now().UnixNano())
	owner, writer := rowWriter(t, db, dsn, table)
	ctx := context.Background()
	l := newLocker(t, writer, sqllock.WithTable(table))
	if err := l.Migrate(ctx); err != nil {
		t.Fatalf("Migrate as a role that may write the rows of up-to-date tables: %v", err)
	}
	lease, err := l.Acquire(ctx, uniqueKey(t), driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	if err := owner.Exec("ALTER TABLE " + table + " SET (fillfactor = 70)").Error; err != nil {
		t.Fatal(err)
	}
	if err := newLocker(t, owner, sqllock.WithTable(table)).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var options string
	owner.Raw("SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = to_regclass(?)", table).Scan(&options)
	if options != "fillfactor=50" {
		t.Errorf("the lock table's options after Migrate: %q; want fillfactor=50", options)
	}
}

// rowWriter migrates table on PostgreSQL, and returns its owner's client
// and that of a role that may read and write the rows of the table and
// the fence table, and not alter them. Both tables are dropped, and the
// role, when t ends.
func rowWriter(t *testing.T, db database, dsn, table string) (owner, writer *gorm.DB) {
	t.Helper()
	owner = migrated(t, db, dsn, sqllock.WithTable(table))
	t.Cleanup(func() { owner.Exec("DROP TABLE " + table) })
	role := table + "_role"
	tables := table + ", " + sqllock.DefaultFenceTable
	for _, s := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD 'rw-Pass-3'",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + tables + " TO " + role,
	} {
		if err := owner.Exec(s).Error; err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		owner.Exec("REVOKE ALL ON " + tables + " FROM " + role)
		owner.Exec("DROP ROLE " + role)
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "rw-Pass-3")
	return owner, openDB(t, db, u.String())
}

// TestMigrateReadsFillfactor: Migrate compares the lock table's fillfactor
// as the number PostgreSQL reads from its text, not the text: one written
// otherwise ('50.0', '0x32') is 50, and Migrate as a role that may not
// alter the table passes; one that is not 50 (none, after RESET, or '050',
// octal) is set by the owner's Migrate, and refused to the other role for
// good (ErrInvalidOption), saying that the owner must set it.
func TestMigrateReadsFillfactor(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	table := fmt.Sprintf("fillfactor_%d", time.Now().UnixNano())
	owner, writer := rowWriter(t, db, dsn, table)
	ctx := context.Background()
	options := func() string {
		var o string
		owner.Raw("SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = to_regclass(?)", table).Scan(&o)
		return o
	}
	for _, v := range []string{"'50.0'", "' 50 '", "'0x32'", "'50.4'", "'5e1'"} {
		mustSet(t, owner, "ALTER TABLE "+table+" SET (fillfactor = "+v+")")
		before := options()
		if err := newLocker(t, writer, sqllock.WithTable(table)).Migrate(ctx); err != nil {
			t.Errorf("Migrate as a row writer with fillfactor %s: %v", v, err)
		}
		if after := options(); after != before {
			t.Errorf("fillfactor %s: options %q after Migrate; want them left as %q", v, after, before)
		}
	}
	for _, change := range []string{"RESET (fillfactor)", "SET (fillfactor = '050')"} {
		mustSet(t, owner, "ALTER TABLE "+table+" "+change)
		err := newLocker(t, writer, sqllock.WithTable(table)).Migrate(ctx)
		if !errors.Is(err, driver.ErrInvalidOption) || errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "owner") {
			t.Errorf("Migrate as a row writer after %s: %v; want an ErrInvalidOption saying the owner must set it", change, err)
		}
		if err := newLocker(t, owner, sqllock.WithTable(table)).Migrate(ctx); err != nil {
			t.Fatalf("Migrate as the owner after %s: %v", change, err)
		}
		if o := options(); o != "fillfactor=50" {
			t.Errorf("the owner's Migrate after %s: options %q; want fillfactor=50", change, o)
		}
	}
}

func mustSet(t *testing.T, db *gorm.DB, statement string) {
	t.Helper()
	if err := db.Exec(statement).Error; err != nil {
		t.Fatalf("%s: %v", statement, err)
	}
}

// TestMigrateRefusesAutocommitOff: on MySQL, a session with autocommit off
// (a DSN parameter the driver sets on every connection) would leave every
// acquisition and release uncommitted; Migrate and Check, of the Locker
// and of the Store, refuse it, naming the setting.
func TestMigrateRefusesAutocommitOff(t *testing.T) {
	db := mariaDB()
	dsn := db.dsn(t)
	table := fmt.Sprintf("noautocommit_%d", time.Now().UnixNano())
	g := openDB(t, db, dsn+"&autocommit=0")
	t.Cleanup(func() { openDB(t, db, dsn).Exec("DROP TABLE IF EXISTS " + table + ", " + table + "_idem") })
	ctx := context.Background()
	l := newLocker(t, g, sqllock.WithTable(table))
	s, err := sqllock.NewStore(g, sqllock.WithStoreTable(table+"_idem"))
	if err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func(context.Context) error{
		"Locker.Migrate": l.Migrate, "Store.Migrate": s.Migrate, "Locker.Check": l.Check, "Store.Check": s.Check,
	} {
		if err := call(ctx); !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "autocommit") {
			t.Errorf("%s with autocommit=0: %v; want an ErrInvalidOption naming autocommit", name, err)
		}
	}
}

// TestMigrateMakesInnoDBTables: on MySQL, Migrate makes its tables InnoDB
// whatever the session's default engine (MyISAM here, as a DSN parameter),
// and refuses a table of the same name on an engine without transactions,
// on which a statement refused midway keeps what it wrote.
func TestMigrateMakesInnoDBTables(t *testing.T) {
	db := mariaDB()
	dsn := db.dsn(t)
	table := fmt.Sprintf("engine_%d", time.Now().UnixNano())
	idem, myisam := table+"_idem", table+"_myisam"
	admin := openDB(t, db, dsn)
	t.Cleanup(func() { admin.Exec("DROP TABLE IF EXISTS " + table + ", " + idem + ", " + myisam) })
	g := openDB(t, db, dsn+"&default_storage_engine=MyISAM")
	ctx := context.Background()
	if err := newLocker(t, g, sqllock.WithTable(table)).Migrate(ctx); err != nil {
		t.Fatalf("Locker.Migrate: %v", err)
	}
	s, err := sqllock.NewStore(g, sqllock.WithStoreTable(idem))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Store.Migrate: %v", err)
	}
	for _, name := range []string{table, idem} {
		var engine string
		admin.Raw("SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", name).Scan(&engine)
		if engine != "InnoDB" {
			t.Errorf("Migrate made %s with the engine %q; want InnoDB", name, engine)
		}
	}

	if err := admin.Exec("CREATE TABLE " + myisam + " (name VARBINARY(255) NOT NULL PRIMARY KEY) ENGINE=MyISAM").Error; err != nil {
		t.Fatal(err)
	}
	err = newLocker(t, admin, sqllock.WithTable(myisam)).Migrate(ctx)
	if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "MyISAM engine, which has no transactions") {
		t.Errorf("Locker.Migrate on a MyISAM lock table: %v; want an ErrInvalidOption naming the engine", err)
	}
	s, err = sqllock.NewStore(admin, sqllock.WithStoreTable(myisam))
	if err != nil {
		t.Fatal(err)
	}
	err = s.Migrate(ctx)
	if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "MyISAM engine, which has no transactions") {
		t.Errorf("Store.Migrate on a MyISAM idempotency table: %v; want an ErrInvalidOption naming the engine", err)
	}
}

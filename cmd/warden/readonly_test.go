package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
)

// heldAndRecorded holds a lock under key, as a service on lockURL would,
// and claims an idempotency record under scope "s" and key, for the
// commands to look at.
func heldAndRecorded(t *testing.T, lockURL, key string) *guard.Guard {
	t.Helper()
	ctx := context.Background()
	g := serviceGuard(t, lockURL, "svc", time.Minute)
	held, err := g.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Unlock(ctx) })
	if _, err := openStore(t, lockURL).Claim(ctx, idempotency.Claim{Scope: "s", Key: key, Owner: "api-1:o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	return g
}

// looks runs the commands that only read on lockURL, which must succeed.
func looks(t *testing.T, lockURL, key string) {
	t.Helper()
	for _, args := range [][]string{
		{"locks", "ls", key},
		{"locks", "show", key},
		{"idem", "show", "s", key},
	} {
		code, out, errOut := cliRun(t, "", append([]string{"-lock", lockURL}, args...)...)
		if code != 0 || !strings.Contains(out, key) {
			t.Errorf("%q with %s: exit %d, %q, %q; want %s shown", args, lockURL, code, out, errOut, key)
		}
	}
}

// refusesChanges asks, on lockURL, which may not write, for key's release
// and its record's delete: each must fail saying that it was not done, not
// that it may have been, and key must still be held.
func refusesChanges(t *testing.T, g *guard.Guard, lockURL, key string) {
	t.Helper()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-yes", "-any-holder", "locks", "release", key}, "was not released"},
		{[]string{"-yes", "idem", "delete", "s", key}, "was not deleted"},
	} {
		code, out, errOut := cliRun(t, "", append([]string{"-lock", lockURL}, tc.args...)...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q with %s: exit %d, %q, %q; want 1, saying it %s", tc.args, lockURL, code, out, errOut, tc.want)
		}
	}
	if in, err := g.Inspect(context.Background(), key); err != nil || len(in.Holders) != 1 {
		t.Errorf("%s after a refused release: %+v, %v; want it held", key, in, err)
	}
}

// changes releases key and deletes its record on lockURL, which must
// succeed.
func changes(t *testing.T, g *guard.Guard, lockURL, key string) {
	t.Helper()
	for _, args := range [][]string{
		{"-yes", "-any-holder", "locks", "release", key},
		{"-yes", "idem", "delete", "s", key},
	} {
		code, out, errOut := cliRun(t, "", append([]string{"-lock", lockURL}, args...)...)
		if code != 0 {
			t.Errorf("%q with %s: exit %d, %q, %q; want it done", args, lockURL, code, out, errOut)
		}
	}
	if in, err := g.Inspect(context.Background(), key); err != nil || len(in.Holders) != 0 {
		t.Errorf("%s after the release: %+v, %v; want it free", key, in, err)
	}
}

// refusesMissingTables runs commands on lockURL, whose database has no
// warden tables: each must fail, saying so, and make none.
func refusesMissingTables(t *testing.T, lockURL string, tables func() int) {
	t.Helper()
	refused := func(table string, args ...string) {
		t.Helper()
		code, out, errOut := cliRun(t, "", append([]string{"-lock", lockURL}, args...)...)
		if code != 1 || !strings.Contains(errOut, "no "+table+" table") {
			t.Errorf("%q on a database without the %s table: exit %d, %q, %q; want 1 and the table named missing", args, table, code, out, errOut)
		}
	}
	refused("lock", "locks", "ls")
	refused("lock", "-yes", "-any-holder", "locks", "release", "k")
	refused("idempotency", "-yes", "idem", "delete", "s", "k")
	// The lock backend's tables are there, and the store's is not.
	serviceGuard(t, lockURL, "svc", time.Minute)
	refused("idempotency", "idem", "show", "s", "k")
	if n := tables(); n != 2 {
		t.Errorf("%d tables after the commands and a service's open; want the service's 2 (locks, fences)", n)
	}
}

// sqlDB opens d's database with gorm, for the test's own statements.
func sqlDB(t *testing.T, d gorm.Dialector) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s, err := db.DB(); err == nil {
			s.Close()
		}
	})
	return db
}

func mustExec(t *testing.T, db *gorm.DB, statements ...string) {
	t.Helper()
	for _, s := range statements {
		if err := db.Exec(s).Error; err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// TestReadOnlyPostgres: a role granted SELECT alone on the tables (an
// auditor's), and a connection whose transactions are read-only (a
// replica's, default_transaction_read_only=on), list and show locks and
// show records, and a release or a delete they ask for is refused, said
// not done; a role that may write the rows but not change the schema
// releases a lock and deletes a record. The open ran sqllock's migration,
// whose ALTER TABLE neither may run. A database without the tables is
// refused, and given none.
func TestReadOnlyPostgres(t *testing.T) {
	pg := backendURLs(t)["postgres"]
	admin := sqlDB(t, postgres.Open(pg))
	key := fmt.Sprintf("cli-ro/%d", time.Now().UnixNano())
	g := heldAndRecorded(t, pg, key)
	tables := sqllock.DefaultTable + ", " + sqllock.DefaultIdempotencyTable
	suffix := fmt.Sprint(time.Now().UnixNano())
	reader, writer := "warden_reader_"+suffix, "warden_writer_"+suffix
	for _, role := range []string{reader, writer} {
		mustExec(t, admin, "CREATE ROLE "+role+" LOGIN PASSWORD '"+rolePassword+"'")
		t.Cleanup(func() {
			mustExec(t, admin, "REVOKE ALL ON "+tables+" FROM "+role, "DROP ROLE "+role)
		})
	}
	mustExec(t, admin, "GRANT SELECT ON "+tables+" TO "+reader,
		"GRANT SELECT, UPDATE, DELETE ON "+tables+" TO "+writer)

	for _, readOnly := range []string{withPostgres(t, pg, reader, ""), withPostgres(t, pg, "", "default_transaction_read_only=on")} {
		looks(t, readOnly, key)
		refusesChanges(t, g, readOnly, key)
	}
	changes(t, g, withPostgres(t, pg, writer, ""), key)

	schema := "warden_empty_" + suffix
	mustExec(t, admin, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { mustExec(t, admin, "DROP SCHEMA "+schema+" CASCADE") })
	refusesMissingTables(t, withPostgres(t, pg, "", "search_path="+schema), func() int {
		var n int
		admin.Raw("SELECT count(*) FROM information_schema.tables WHERE table_schema = ?", schema).Scan(&n)
		return n
	})
}

// rolePassword is the password of the roles TestReadOnlyPostgres makes.
const rolePassword = "ro-Pass-7"

// withPostgres is the PostgreSQL URL pg as role (with rolePassword), when
// role is not "", with param added when it is not "".
func withPostgres(t *testing.T, pg, role, param string) string {
	t.Helper()
	u, err := url.Parse(pg)
	if err != nil {
		t.Fatal(err)
	}
	if role != "" {
		u.User = url.UserPassword(role, rolePassword)
	}
	if param != "" {
		u.RawQuery += "&" + param
	}
	return u.String()
}

// TestReadOnlyMariaDB: a session whose transactions are read-only
// (tx_read_only=1, a replica's) lists and shows locks and shows records,
// and says that a release or a delete it asks for was not done; a
// database without the tables is refused, and given none. (The shared
// server's user may not grant: a role of SELECT alone is tried on
// PostgreSQL.)
func TestReadOnlyMariaDB(t *testing.T) {
	my := backendURLs(t)["mysql"]
	dsn := strings.TrimPrefix(my, "mysql://")
	admin := sqlDB(t, mysql.Open(dsn))
	key := fmt.Sprintf("cli-ro/%d", time.Now().UnixNano())
	g := heldAndRecorded(t, my, key)
	looks(t, my+"&tx_read_only=1", key)
	refusesChanges(t, g, my+"&tx_read_only=1", key)

	database := fmt.Sprintf("warden_empty_%d", time.Now().UnixNano())
	mustExec(t, admin, "CREATE DATABASE "+database)
	t.Cleanup(func() { mustExec(t, admin, "DROP DATABASE "+database) })
	before, params, _ := strings.Cut(my, "?")
	empty := before[:strings.LastIndex(before, "/")+1] + database + "?" + params
	refusesMissingTables(t, empty, func() int {
		var n int
		admin.Raw("SELECT count(*) FROM information_schema.tables WHERE table_schema = ?", database).Scan(&n)
		return n
	})
}

// TestReadOnlySQLite: a file opened read-only (mode=ro) is listed and
// shown, whichever journal its writers use (the open's switch to WAL,
// which a read-only connection may not make, is not asked for there), and
// a release or a delete asked there is said not done. A file without the tables is refused, and given none.
func TestReadOnlySQLite(t *testing.T) {
	dir := t.TempDir()
	key := fmt.Sprintf("cli-ro/%d", time.Now().UnixNano())
	wal := filepath.Join(dir, "wal.db")
	walHolder := heldAndRecorded(t, "sqlite://"+wal, key)
	looks(t, "sqlite://file:"+wal+"?mode=ro", key)
	refusesChanges(t, walHolder, "sqlite://file:"+wal+"?mode=ro", key)

	// A service that opened the file with gorm itself, in SQLite's
	// rollback journal.
	rollback := filepath.Join(dir, "rollback.db")
	db := sqlDB(t, sqlite.Open(rollback))
	l, err := sqllock.New(db)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sqllock.NewStore(db)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(l, guard.WithOwner("svc"), guard.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	held, err := g.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	if _, err := s.Claim(ctx, idempotency.Claim{Scope: "s", Key: key, Owner: "api-1:o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	looks(t, "sqlite://file:"+rollback+"?mode=ro", key)
	refusesChanges(t, g, "sqlite://file:"+rollback+"?mode=ro", key)
	var mode string
	db.Raw("PRAGMA journal_mode").Scan(&mode)
	if mode != "delete" {
		t.Errorf("the journal after the commands: %q; want the service's (delete)", mode)
	}

	empty := filepath.Join(dir, "other.db")
	other := sqlDB(t, sqlite.Open(empty))
	mustExec(t, other, "CREATE TABLE orders (id integer)")
	refusesMissingTables(t, "sqlite://"+empty, func() int {
		var n int
		other.Raw("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 'warden%'").Scan(&n)
		return n
	})
}

// TestMyISAMTables: on MariaDB tables of an engine without transactions,
// on which a release or a delete refused midway may have written, the
// commands refuse to work, naming the engine, rather than say what they
// cannot know.
func TestMyISAMTables(t *testing.T) {
	my := backendURLs(t)["mysql"]
	admin := sqlDB(t, mysql.Open(strings.TrimPrefix(my, "mysql://")))
	database := fmt.Sprintf("warden_myisam_%d", time.Now().UnixNano())
	mustExec(t, admin, "CREATE DATABASE "+database)
	t.Cleanup(func() { mustExec(t, admin, "DROP DATABASE "+database) })
	mustExec(t, admin,
		"CREATE TABLE "+database+"."+sqllock.DefaultTable+" (name VARBINARY(255) NOT NULL PRIMARY KEY, owner VARCHAR(255) NOT NULL,"+
			" version BIGINT NOT NULL, lock_until BIGINT NOT NULL, locked_at BIGINT NOT NULL, waiting_until BIGINT NOT NULL DEFAULT 0) ENGINE=MyISAM",
		"CREATE TABLE "+database+"."+sqllock.DefaultIdempotencyTable+" (id VARCHAR(64) NOT NULL PRIMARY KEY, scope LONGBLOB, idem_key LONGBLOB,"+
			" state VARCHAR(16) NOT NULL, fingerprint LONGBLOB, owner LONGBLOB, claim_id VARCHAR(32) NOT NULL, response LONGBLOB,"+
			" expires_at BIGINT NOT NULL) ENGINE=MyISAM")
	before, params, _ := strings.Cut(my, "?")
	lockURL := before[:strings.LastIndex(before, "/")+1] + database + "?" + params
	for _, args := range [][]string{
		{"locks", "ls"},
		{"-yes", "-any-holder", "locks", "release", "k"},
		{"idem", "show", "s", "k"},
		{"-yes", "idem", "delete", "s", "k"},
	} {
		code, out, errOut := cliRun(t, "", append([]string{"-lock", lockURL}, args...)...)
		if code != 1 || !strings.Contains(errOut, "MyISAM engine, which has no transactions") {
			t.Errorf("%q on MyISAM tables: exit %d, %q, %q; want 1, naming the engine", args, code, out, errOut)
		}
	}
}

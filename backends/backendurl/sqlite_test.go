package backendurl

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/guard/driver"
)

// TestSQLiteParametersKeepPragmas: a path with parameters of its own (a
// file: URI, ?cache=shared) still gets the WAL journal and the busy
// timeout that let several processes share the file, and opens; so does a
// plain path with ?mode=ro, from which SQLite reads no mode (only a file:
// URI's is read, and makes the connection read-only).
func TestSQLiteParametersKeepPragmas(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{
		filepath.Join(dir, "plain.db"),
		filepath.Join(dir, "shared.db") + "?cache=shared",
		filepath.Join(dir, "plain-ro.db") + "?mode=ro",
		"file:" + filepath.Join(dir, "uri.db") + "?mode=rwc",
	} {
		u, err := Parse("sqlite://" + path)
		if err != nil {
			t.Fatal(err)
		}
		o := NewOpener()
		defer o.Close()
		if _, err := o.Locker(context.Background(), u, time.Second); err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		db, _ := o.SQL(context.Background(), u)
		var mode string
		var busy int
		db.Raw("PRAGMA journal_mode").Scan(&mode)
		db.Raw("PRAGMA busy_timeout").Scan(&busy)
		if mode != "wal" || busy != 10000 {
			t.Errorf("%s: journal_mode %q, busy_timeout %d; want wal and 10000", path, mode, busy)
		}
	}
}

// TestSQLiteInMemoryRefused: an in-memory (or temporary) SQLite database
// is one per connection, and a pool holds several: a lock taken on one
// connection is not seen on the next, whose database has no lock table.
// Such a URL is refused, pointing to the memory backend.
func TestSQLiteInMemoryRefused(t *testing.T) {
	for _, s := range []string{"sqlite://:memory:", "sqlite://:memory:?cache=shared", "sqlite://file::memory:",
		"sqlite://file::memory:?cache=shared", "sqlite://file:x.db?mode=memory", "sqlite://file:"} {
		_, err := Parse(s)
		if err == nil || !strings.Contains(err.Error(), "memory for") {
			t.Errorf("Parse(%q): %v; want a refusal pointing to the memory backend", s, err)
		}
	}
}

// TestSQLiteStaysLocked: an SQLite file whose writer never finishes fails
// the open once its bound has passed, saying the file stayed locked, with
// SQLite's SQLITE_BUSY rather than the bound's "context deadline
// exceeded".
func TestSQLiteStaysLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locked.db")
	defer writing(t, path).Rollback()
	u, err := Parse("sqlite://" + path)
	if err != nil {
		t.Fatal(err)
	}
	o := NewOpener()
	defer o.Close()
	_, err = o.Locker(context.Background(), u, time.Second)
	if !errors.Is(err, driver.ErrUnavailable) || !sqliteBusy(err) || !strings.Contains(err.Error(), "stayed locked") {
		t.Errorf("open of a file that stays locked: %v; want ErrUnavailable saying the file stayed locked, with SQLITE_BUSY", err)
	}
}

// writing creates the SQLite file at path with a table, and returns a
// transaction that has written to it in its rollback journal: the file is
// locked until the transaction ends.
func writing(t *testing.T, path string) *gorm.DB {
	t.Helper()
	writer, err := gorm.Open(sqlite.Open(path), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.Exec("CREATE TABLE orders (id integer)").Error; err != nil {
		t.Fatal(err)
	}
	tx := writer.Begin()
	if err := tx.Exec("INSERT INTO orders VALUES (1)").Error; err != nil {
		t.Fatal(err)
	}
	return tx
}

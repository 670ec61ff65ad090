package backendurl

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSQLiteParametersKeepPragmas: a path with parameters of its own (a
// file: URI, ?cache=shared) still gets the WAL journal and the busy
// timeout that let several processes share the file, and opens.
func TestSQLiteParametersKeepPragmas(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{
		filepath.Join(dir, "plain.db"),
		filepath.Join(dir, "shared.db") + "?cache=shared",
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

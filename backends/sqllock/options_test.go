package sqllock_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// TestNewRefusesBadOptions: table names spliced into the SQL and owner ids
// the owner column could not hold are refused by New, naming them.
func TestNewRefusesBadOptions(t *testing.T) {
	g, err := gorm.Open(sqlite.Open(t.TempDir()+"/options.db"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]sqllock.Option{}
	for _, table := range []string{"", "a.b.c", "locks; DROP TABLE x", "a b", "1locks", "locks\x00", "a..b", strings.Repeat("t", 64)} {
		bad["table "+strconv.Quote(table)] = sqllock.WithTable(table)
	}
	for _, owner := range []string{"", "host\x00pid", "host\xffpid", strings.Repeat("o", 201)} {
		bad["owner "+strconv.Quote(owner)] = sqllock.WithOwner(owner)
	}
	for what, o := range bad {
		if _, err := sqllock.New(g, o); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("New with %s: got %v, want ErrInvalidOption", what, err)
		} else if !strings.Contains(err.Error(), strings.TrimPrefix(strings.TrimPrefix(what, "table "), "owner ")) {
			t.Errorf("New with %s: %v does not name it", what, err)
		}
	}
	for _, o := range []sqllock.Option{sqllock.WithTable("locks_2"), sqllock.WithTable("warden.locks"), sqllock.WithOwner("hôte:1:abc\t(label-like)")} {
		if _, err := sqllock.New(g, o); err != nil {
			t.Errorf("New: %v", err)
		}
	}
}

// TestDryRunRefused: a Locker or a Store on a dry-run session is refused
// with ErrInvalidOption. The session's statements do not run, but the
// Locker's acquisitions, sent to the pool, would have: it took real locks
// and failed to inspect them, and the Store's reads failed as an outage.
func TestDryRunRefused(t *testing.T) {
	g, err := gorm.Open(sqlite.Open(t.TempDir()+"/dry.db"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	dry := g.Session(&gorm.Session{DryRun: true})
	if l, err := sqllock.New(dry); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("New on a dry-run session: (%v, %v), want ErrInvalidOption", l, err)
	}
	if st, err := sqllock.NewStore(dry); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("NewStore on a dry-run session: (%v, %v), want ErrInvalidOption", st, err)
	}
}

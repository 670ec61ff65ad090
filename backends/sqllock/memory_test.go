package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// openSQLite opens d with a pool of at most conns connections (0: no limit).
func openSQLite(t *testing.T, d gorm.Dialector, conns int) (*gorm.DB, *sql.DB) {
	g, pool := openConfig(t, d, &gorm.Config{Logger: logger.Discard})
	pool.SetMaxOpenConns(conns)
	return g, pool
}

// TestInMemorySQLite: Migrate refuses a private in-memory SQLite database
// that the pool may open more than once, a database per connection, and
// accepts one with a pool of one connection, or a shared one; a refused
// Migrate makes no table, and one in a schema not attached is refused as
// such. A table that
// names its schema (main.locks) is checked as well, and the check needs no
// second connection at once.
func TestInMemorySQLite(t *testing.T) {
	open := func(t *testing.T, dsn string, conns int, table string) (*sql.DB, *sqllock.Locker, *sqllock.Store) {
		g, pool := openSQLite(t, sqlite.Open(dsn), conns)
		var lopts []sqllock.Option
		var sopts []sqllock.StoreOption
		if table != "" {
			lopts = append(lopts, sqllock.WithTable(table+"_locks"))
			sopts = append(sopts, sqllock.WithStoreTable(table+"_idem"))
		}
		st, err := sqllock.NewStore(g, sopts...)
		if err != nil {
			t.Fatal(err)
		}
		return pool, newLocker(t, g, lopts...), st
	}
	ctx := context.Background()

	for name, table := range map[string]string{"private": "", "private, qualified": "main.warden"} {
		t.Run(name, func(t *testing.T) {
			_, l, st := open(t, ":memory:", 0, table)
			for what, err := range map[string]error{"Locker": l.Migrate(ctx), "Store": st.Migrate(ctx)} {
				if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "SetMaxOpenConns(1)") {
					t.Errorf("%s.Migrate of :memory: on a pool of many connections: %v, want ErrInvalidOption naming the fix", what, err)
				}
			}
			// The refused Migrate left no table that an application going
			// on despite the refusal would lock in, one per connection.
			if lease, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Minute}); err == nil {
				lease.Release(ctx)
				t.Errorf("Acquire after a refused Migrate granted a lease, want the table missing")
			}
		})
	}
	t.Run("schema not attached", func(t *testing.T) {
		g, _ := openSQLite(t, sqlite.Open(t.TempDir()+"/warden.db"), 2)
		err := newLocker(t, g, sqllock.WithTable("nosuch.locks")).Migrate(ctx)
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), `"nosuch"`) {
			t.Errorf("Migrate of a table in a schema not attached: %v, want ErrInvalidOption naming the schema", err)
		}
	})
	t.Run("shared, one of two connections in use", func(t *testing.T) {
		pool, l, st := open(t, fmt.Sprintf("file:warden%d?mode=memory&cache=shared", time.Now().UnixNano()), 2, "")
		busy, err := pool.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		// Bounded, for the failure's sake: the check used to wait for a
		// second connection until its ctx ended.
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := errors.Join(l.Migrate(mctx), st.Migrate(mctx)); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	})
	for name, c := range map[string]struct {
		dsn   string
		conns int
	}{
		"one connection": {":memory:", 1},
		"shared":         {fmt.Sprintf("file:warden%d?mode=memory&cache=shared", time.Now().UnixNano()), 0},
	} {
		t.Run(name, func(t *testing.T) {
			_, l, st := open(t, c.dsn, c.conns, "")
			if err := errors.Join(l.Migrate(ctx), st.Migrate(ctx)); err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			lease, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			if _, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("Acquire of a held lock: %v, want ErrNotAcquired", err)
			}
		})
	}
}

// wrappedDialector is an application's dialector around another, which it
// embeds as the interface.
type wrappedDialector struct{ gorm.Dialector }

// extraDialector embeds, beside the dialector, a pointer (here nil) to a
// struct with a DSN field of its own.
type extraDialector struct {
	gorm.Dialector
	*dialectorExtra
}

type dialectorExtra struct{ DSN string }

// TestInMemorySQLiteDSN: whether an in-memory SQLite database is shared is
// as SQLite reads the DSN, not as a URL parser does: of a repeated cache
// parameter the last counts, and nothing after a '#'. A dialector that
// wraps the SQLite one is read through, without a panic on a nil embedded
// pointer. An accepted database is one for every connection: a lock held
// on one is held on another.
func TestInMemorySQLiteDSN(t *testing.T) {
	ctx := context.Background()
	for name, c := range map[string]struct {
		query  string
		wrap   func(gorm.Dialector) gorm.Dialector
		shared bool
	}{
		"cache shared, then private": {query: "mode=memory&cache=shared&cache=private"},
		"cache private, then shared": {query: "mode=memory&cache=private&cache=shared", shared: true},
		"cache after a '#'":          {query: "mode=memory#&cache=shared"},
		"wrapped": {query: "mode=memory&cache=shared", shared: true,
			wrap: func(d gorm.Dialector) gorm.Dialector { return wrappedDialector{d} }},
		"wrapped, nil embedded pointer": {query: "mode=memory&cache=shared", shared: true,
			wrap: func(d gorm.Dialector) gorm.Dialector { return extraDialector{Dialector: d} }},
	} {
		t.Run(name, func(t *testing.T) {
			var d gorm.Dialector = sqlite.Open(fmt.Sprintf("file:warden%d?%s", time.Now().UnixNano(), c.query))
			if c.wrap != nil {
				d = c.wrap(d)
			}
			g, pool := openSQLite(t, d, 2)
			l := newLocker(t, g)
			err := l.Migrate(ctx)
			if !c.shared {
				if !errors.Is(err, driver.ErrInvalidOption) {
					t.Fatalf("Migrate of a database per connection: %v, want ErrInvalidOption", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Migrate of a shared database: %v", err)
			}
			lease, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			// The second Acquire runs on the other connection.
			busy, err := pool.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Close()
			if _, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("Acquire of a held lock on another connection: %v, want ErrNotAcquired", err)
			}
		})
	}
}

// reopenDialector is an application's dialector around the SQLite one
// whose Initialize opens the pool given, not the embedded dialector's DSN.
type reopenDialector struct {
	*sqlite.Dialector
	pool *sql.DB
}

func (d reopenDialector) Initialize(db *gorm.DB) error {
	return (&sqlite.Dialector{Conn: d.pool}).Initialize(db)
}

// TestInMemorySQLiteNotTheDSN: a private in-memory database opened otherwise
// than by the dialector's DSN (a dialector given a Conn, which gorm uses
// whatever the DSN names, or a wrapper that opens its own pool) is refused,
// however the DSN reads: a shared database that it names, attached to the
// pool's connections, is not their main; its words in SQLite's refusal to
// attach it ("no such vfs: database is already attached") are not SQLite's
// sign of a shared database; and the check creates no file that it names.
func TestInMemorySQLiteNotTheDSN(t *testing.T) {
	ctx := context.Background()
	for name, c := range map[string]struct {
		dsn  func(dir string) string
		open func(dsn string, pool *sql.DB) gorm.Dialector
		// attach, when set, attaches dsn to both connections of the pool.
		attach bool
	}{
		"Conn, DSN of a shared database attached to it": {
			dsn: func(string) string {
				return fmt.Sprintf("file:warden%d?mode=memory&cache=shared", time.Now().UnixNano())
			},
			open:   func(dsn string, pool *sql.DB) gorm.Dialector { return &sqlite.Dialector{DSN: dsn, Conn: pool} },
			attach: true,
		},
		"Conn, DSN with the words": {
			dsn:  func(dir string) string { return "file:" + dir + "/missing/database is already attached.db" },
			open: func(dsn string, pool *sql.DB) gorm.Dialector { return &sqlite.Dialector{DSN: dsn, Conn: pool} },
		},
		"Conn, DSN of a file": {
			dsn:  func(dir string) string { return "file:" + dir + "/warden.db" },
			open: func(dsn string, pool *sql.DB) gorm.Dialector { return &sqlite.Dialector{DSN: dsn, Conn: pool} },
		},
		"wrapped Conn, DSN of a file": {
			dsn: func(dir string) string { return "file:" + dir + "/warden.db" },
			open: func(dsn string, pool *sql.DB) gorm.Dialector {
				return wrappedDialector{&sqlite.Dialector{DSN: dsn, Conn: pool}}
			},
		},
		"own pool, DSN with the words": {
			dsn: func(string) string { return "file:warden?mode=memory&vfs=database is already attached" },
			open: func(dsn string, pool *sql.DB) gorm.Dialector {
				return reopenDialector{sqlite.Open(dsn).(*sqlite.Dialector), pool}
			},
		},
		"own pool, DSN of a file": {
			dsn: func(dir string) string { return "file:" + dir + "/warden.db" },
			open: func(dsn string, pool *sql.DB) gorm.Dialector {
				return reopenDialector{sqlite.Open(dsn).(*sqlite.Dialector), pool}
			},
		},
		// The probe's attachment is refused because the DSN's database is
		// attached under another name, not because it is main.
		"own pool, DSN of a shared database attached to it": {
			dsn: func(string) string {
				return fmt.Sprintf("file:warden%d?mode=memory&cache=shared", time.Now().UnixNano())
			},
			open: func(dsn string, pool *sql.DB) gorm.Dialector {
				return reopenDialector{sqlite.Open(dsn).(*sqlite.Dialector), pool}
			},
			attach: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			mem, err := sql.Open("sqlite", ":memory:")
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			dsn := c.dsn(dir)
			if c.attach {
				attachTwice(t, mem, dsn)
			}
			g, _ := openSQLite(t, c.open(dsn, mem), 2)
			l := newLocker(t, g)
			if err := l.Migrate(ctx); !errors.Is(err, driver.ErrInvalidOption) {
				t.Fatalf("Migrate of a database per connection: %v, want ErrInvalidOption", err)
			}
			if names, _ := os.ReadDir(dir); len(names) != 0 {
				t.Errorf("the check created %s in %s", names[0].Name(), dir)
			}
		})
	}
}

// attachTwice attaches dsn to two connections of pool, and leaves both idle.
func attachTwice(t *testing.T, pool *sql.DB, dsn string) {
	ctx := context.Background()
	var conns []*sql.Conn
	for range 2 {
		c, err := pool.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.ExecContext(ctx, "ATTACH DATABASE ? AS other", dsn); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Close()
	}
}

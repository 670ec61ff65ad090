package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
)

// TestInMemorySQLite: Migrate refuses a private in-memory SQLite database
// that the pool may open more than once, a database per connection, and
// accepts one with a pool of one connection, or a shared one.
func TestInMemorySQLite(t *testing.T) {
	open := func(t *testing.T, dsn string, conns int) (*sqllock.Locker, *sqllock.Store) {
		g, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := g.DB()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pool.Close() })
		pool.SetMaxOpenConns(conns)
		st, err := sqllock.NewStore(g)
		if err != nil {
			t.Fatal(err)
		}
		return newLocker(t, g), st
	}
	ctx := context.Background()

	t.Run("private", func(t *testing.T) {
		l, st := open(t, ":memory:", 0)
		for what, err := range map[string]error{"Locker": l.Migrate(ctx), "Store": st.Migrate(ctx)} {
			if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "SetMaxOpenConns(1)") {
				t.Errorf("%s.Migrate of :memory: on a pool of many connections: %v, want ErrInvalidOption naming the fix", what, err)
			}
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
			l, st := open(t, c.dsn, c.conns)
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

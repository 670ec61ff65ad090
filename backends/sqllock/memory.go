package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
)

// oneDatabase refuses an in-memory SQLite database (":memory:") that the
// connection pool of db may open more than once: each connection opens a
// database of its own, so locks taken on one connection are not seen on
// another, and a table migrated on one is missing on the next (a second
// Migrate there made a second lock table, and the lock was granted twice).
// It looks for table, just migrated, from two connections at once: a
// shared in-memory database (file::memory:?cache=shared) shows it on both,
// and a pool of one connection cannot hold two.
func oneDatabase(ctx context.Context, db *gorm.DB, d dialect, table string) error {
	if d.name != "sqlite" || strings.Contains(table, ".") {
		return nil
	}
	pool, err := db.DB()
	if err != nil || pool.Stats().MaxOpenConnections == 1 {
		return nil // bound to a transaction, or a pool of one connection
	}
	var seen [2]bool
	for i := range seen {
		c, err := pool.Conn(ctx)
		if err != nil {
			return unavailable(ctx, err)
		}
		// Both held until the end, so that the second is another
		// connection.
		defer c.Close()
		var file string
		if err := c.QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil {
			return unavailable(ctx, err)
		}
		if file != "" {
			return nil
		}
		err = c.QueryRowContext(ctx, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", table).Scan(new(int))
		if err != nil && err != sql.ErrNoRows {
			return unavailable(ctx, err)
		}
		seen[i] = err == nil
	}
	if seen[0] && seen[1] {
		return nil
	}
	return fmt.Errorf("%w: an in-memory SQLite database (:memory:) is one per connection, and the pool may open several,"+
		" whose locks would not exclude each other: limit the pool to one connection (SetMaxOpenConns(1) on db.DB()),"+
		" or open a file, or a shared one (file:name?mode=memory&cache=shared)", driver.ErrInvalidOption)
}

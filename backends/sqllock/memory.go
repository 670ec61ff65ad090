package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"reflect"
	"strings"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
)

// oneDatabase refuses an in-memory SQLite database (":memory:") that the
// connection pool of db may open more than once: each connection opens a
// database of its own, so locks taken on one connection are not seen on
// another, and a table migrated on one is missing on the next (a second
// Migrate there made a second lock table, and the lock was granted twice).
// table's schema (main, or the one it names, as in "main.locks") is
// accepted when it is a file, when the pool holds one connection, or when
// it is main and the dialector's DSN opened it shared (cache=shared, as in
// file:name?mode=memory&cache=shared). The check asks one connection, so
// that it does not wait for a second one that the application holds. A
// temporary or attached in-memory schema is one per connection whatever
// the DSN, as is a database opened without a DSN (a dialector given a
// Conn), whose sharing cannot be read.
func oneDatabase(ctx context.Context, db *gorm.DB, d dialect, table string) error {
	if d.name != "sqlite" {
		return nil
	}
	pool, err := db.DB()
	if err != nil || pool.Stats().MaxOpenConnections == 1 {
		return nil // bound to a transaction, or a pool of one connection
	}
	schema, _, qualified := strings.Cut(table, ".")
	if !qualified {
		schema = "main"
	}
	var file string
	err = pool.QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = ? COLLATE NOCASE", schema).Scan(&file)
	switch {
	case err == sql.ErrNoRows:
		// Attached on another connection only.
	case err != nil:
		return unavailable(ctx, err)
	case file != "":
		return nil
	case strings.EqualFold(schema, "main") && sharedCache(dialectorDSN(db)):
		return nil
	}
	return fmt.Errorf("%w: an in-memory SQLite database (:memory:) is one per connection, and the pool may open several,"+
		" whose locks would not exclude each other: limit the pool to one connection (SetMaxOpenConns(1) on db.DB()),"+
		" or open a file, or a shared one by the dialector's DSN (file:name?mode=memory&cache=shared)", driver.ErrInvalidOption)
}

// dialectorDSN is the DSN field of db's dialector (gorm.io/driver/sqlite's
// and github.com/glebarez/sqlite's have one), read by reflection so that
// the package links neither, or "".
func dialectorDSN(db *gorm.DB) string {
	v := reflect.Indirect(reflect.ValueOf(db.Dialector))
	if v.Kind() != reflect.Struct {
		return ""
	}
	if f := v.FieldByName("DSN"); f.Kind() == reflect.String {
		return f.String()
	}
	return ""
}

// sharedCache reports whether dsn, an SQLite URI filename, opens its
// database in shared-cache mode, which makes the connections of a process
// that name one in-memory database share it.
func sharedCache(dsn string) bool {
	if len(dsn) < 5 || !strings.EqualFold(dsn[:5], "file:") {
		return false // not a URI: its parameters are part of a file name
	}
	_, query, _ := strings.Cut(dsn, "?")
	v, err := url.ParseQuery(query)
	return err == nil && v.Get("cache") == "shared"
}

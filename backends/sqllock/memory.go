package sqllock

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"fmt"
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
// it is main and SQLite itself says that the dialector's DSN names it
// shared (see sharedMain). The check asks one connection, so that it does
// not wait for a second one that the application holds. A temporary or
// attached in-memory schema is one per connection whatever the DSN, as is
// a database opened without a DSN (a dialector given a Conn), whose
// sharing cannot be asked.
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
	conn, err := pool.Conn(ctx)
	if err != nil {
		return unavailable(ctx, err)
	}
	defer conn.Close()
	var file string
	err = conn.QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = ? COLLATE NOCASE", schema).Scan(&file)
	switch {
	case err == sql.ErrNoRows:
		// Attached on another connection only.
	case err != nil:
		return unavailable(ctx, err)
	case file != "":
		return nil
	case strings.EqualFold(schema, "main"):
		shared, err := sharedMain(ctx, conn, dialectorDSN(reflect.ValueOf(db.Dialector), 0))
		if err != nil {
			return unavailable(ctx, err)
		}
		if shared {
			return nil
		}
	}
	return fmt.Errorf("%w: an in-memory SQLite database (:memory:) is one per connection, and the pool may open several,"+
		" whose locks would not exclude each other: limit the pool to one connection (SetMaxOpenConns(1) on db.DB()),"+
		" or open a file, or a shared one by the dialector's DSN (file:name?mode=memory&cache=shared)", driver.ErrInvalidOption)
}

// sharedMain reports whether dsn opens the database that conn has as main
// in shared-cache mode, which makes every connection of the process that
// opens dsn share it. SQLite decides, not a reading of dsn here (which went
// wrong on a repeated cache parameter, where SQLite takes the last, and on
// a '#', after which SQLite reads nothing): conn attaches dsn, and SQLite
// refuses to attach a shared-cache database to a connection that has it
// already. A URI alone can ask for shared cache; a DSN that is not one is
// not attached, so that a file it names is not created.
func sharedMain(ctx context.Context, conn *sql.Conn, dsn string) (bool, error) {
	if !strings.HasPrefix(dsn, "file:") {
		return false, nil
	}
	_, err := conn.ExecContext(ctx, "ATTACH DATABASE ? AS warden_probe", dsn)
	if err != nil {
		// "database is already attached" when shared; any other refusal
		// (an alias in use, too many attached) proves nothing.
		return ctx.Err() == nil && strings.Contains(err.Error(), "already attached"), ctx.Err()
	}
	// Another database: detach it, or drop the connection, so that it is
	// not left attached on a connection of the application's pool.
	if _, err := conn.ExecContext(ctx, "DETACH DATABASE warden_probe"); err != nil {
		conn.Raw(func(any) error { return sqldriver.ErrBadConn })
		return false, err
	}
	return false, nil
}

// dialectorDSN is the DSN string field of the dialector v (gorm.io/driver/
// sqlite's and github.com/glebarez/sqlite's have one), read by reflection so
// that the package links neither, or "". It looks through pointers and
// into embedded fields, interfaces included, so that a dialector wrapping
// another by embedding it is read too; a nil one is skipped, not followed
// (reflect's FieldByName panics there). depth bounds a type that embeds a
// pointer to itself.
func dialectorDSN(v reflect.Value, depth int) string {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || depth > 8 {
		return ""
	}
	t := v.Type()
	for i := range t.NumField() {
		if f := t.Field(i); f.Name == "DSN" && f.Type.Kind() == reflect.String {
			return v.Field(i).String()
		}
	}
	for i := range t.NumField() {
		if !t.Field(i).Anonymous {
			continue
		}
		if dsn := dialectorDSN(v.Field(i), depth+1); dsn != "" {
			return dsn
		}
	}
	return ""
}

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
// a database opened without a DSN (a dialector given a Conn, whatever DSN
// it has besides), whose sharing cannot be asked. A schema that the
// connection has not is refused as such: Migrate checks before it makes
// the table, so that AutoMigrate's own error does not come first.
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
		// Not attached on this connection: none, or another only.
		return fmt.Errorf("%w: SQLite has no schema %q on a connection of the pool, which table %q names:"+
			" attach it on every connection (as by the driver's connect hook)", driver.ErrInvalidOption, schema, table)
	case err != nil:
		return unavailable(ctx, err)
	case file != "":
		return nil
	case strings.EqualFold(schema, "main"):
		dsn, _ := dialectorDSN(reflect.ValueOf(db.Dialector), 0)
		shared, err := sharedMain(ctx, conn, dsn)
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
// already. Only a DSN that SQLite opens in memory is attached (see
// inMemoryURI), so that the check never creates a file, whatever dsn names.
func sharedMain(ctx context.Context, conn *sql.Conn, dsn string) (bool, error) {
	if !inMemoryURI(dsn) {
		return false, nil
	}
	// SQLite refuses the attachment when the connection has the database
	// under any name: with another in-memory schema attached (which may be
	// dsn's database, while main is the connection's own), the refusal
	// would not say it is main.
	var others int
	if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM pragma_database_list WHERE file = '' AND name NOT IN ('main', 'temp')").Scan(&others); err != nil || others > 0 {
		return false, err
	}
	_, err := conn.ExecContext(ctx, "ATTACH DATABASE ? AS warden_probe", dsn)
	if err != nil {
		return ctx.Err() == nil && alreadyAttached(err), ctx.Err()
	}
	// Another database: detach it, or drop the connection, so that it is
	// not left attached on a connection of the application's pool.
	if _, err := conn.ExecContext(ctx, "DETACH DATABASE warden_probe"); err != nil {
		conn.Raw(func(any) error { return sqldriver.ErrBadConn })
		return false, err
	}
	return false, nil
}

// alreadyAttached reports whether err is SQLite's refusal to attach a
// shared-cache database to a connection that has it already, and nothing
// else: the whole message is compared, bare (mattn/go-sqlite3) or with the
// code's name and number around it (modernc.org/sqlite), because other
// refusals quote the DSN ("unable to open database: <name>", "no such vfs:
// <vfs>"), and a DSN may contain the words.
func alreadyAttached(err error) bool {
	msg := strings.TrimPrefix(err.Error(), "SQL logic error: ")
	msg = strings.TrimSuffix(msg, " (1)")
	return msg == "database is already attached"
}

// inMemoryURI reports whether SQLite opens the URI filename dsn in memory:
// its path is ":memory:", or the last mode parameter of its query (which
// ends at a '#') is memory. A DSN with a '%' is not read (SQLite decodes
// it, and "mod%65=rwc" is a mode), nor one that is not a URI; either is
// taken as not in memory, which refuses the pool rather than risk creating
// the file it names.
func inMemoryURI(dsn string) bool {
	rest, ok := strings.CutPrefix(dsn, "file:")
	rest, _, _ = strings.Cut(rest, "#")
	if !ok || strings.Contains(rest, "%") {
		return false
	}
	path, query, _ := strings.Cut(rest, "?")
	mode := ""
	for _, p := range strings.Split(query, "&") {
		if k, v, _ := strings.Cut(p, "="); k == "mode" {
			mode = v
		}
	}
	return path == ":memory:" || mode == "memory"
}

// dialectorDSN is the DSN string field of the dialector v (gorm.io/driver/
// sqlite's and github.com/glebarez/sqlite's have one), read by reflection so
// that the package links neither; found reports that v has one. It looks
// through pointers and into embedded fields, interfaces included, so that a
// dialector wrapping another by embedding it is read too; a nil one is
// skipped, not followed (reflect's FieldByName panics there). The first
// dialector found is the answer: one whose Conn is set has no DSN to ask
// (gorm uses the Conn, whatever database the DSN names), and its "" is not
// passed over for a DSN found further on. depth bounds a type that embeds a
// pointer to itself.
func dialectorDSN(v reflect.Value, depth int) (dsn string, found bool) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return "", false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || depth > 8 {
		return "", false
	}
	t := v.Type()
	if f, ok := t.FieldByName("DSN"); ok && len(f.Index) == 1 && f.Type.Kind() == reflect.String {
		if c, ok := t.FieldByName("Conn"); ok && len(c.Index) == 1 && !v.Field(c.Index[0]).IsZero() {
			return "", true
		}
		return v.Field(f.Index[0]).String(), true
	}
	for i := range t.NumField() {
		if !t.Field(i).Anonymous {
			continue
		}
		if dsn, found := dialectorDSN(v.Field(i), depth+1); found {
			return dsn, true
		}
	}
	return "", false
}

package sqllock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
)

// dialect holds the few SQL fragments that differ between the databases.
// Everything else is written once, in the portable subset the three share.
type dialect struct {
	name string
	// now is an expression for the database's current time as integer
	// microseconds since the Unix epoch. Instants are stored in that form
	// because it compares correctly whatever the column types, session time
	// zones and timestamp formats of each database, and because it keeps the
	// arithmetic (now + ttl) in the database, on the database's clock.
	now string
	// upsert says whether the database has INSERT ... ON CONFLICT ... DO
	// UPDATE ... WHERE ... RETURNING (PostgreSQL, SQLite). MySQL has
	// ON DUPLICATE KEY UPDATE instead, which can neither filter nor return.
	upsert bool
	// greatest is the function that returns the greater of its arguments.
	greatest string
}

// dialectOf is the dialect of db, which New and NewStore also refuse in a
// dry-run session: its statements do not run, while the Locker's own, sent
// to the pool, would, so that a Locker would take locks it cannot inspect.
func dialectOf(db *gorm.DB) (dialect, error) {
	if db.DryRun {
		return dialect{}, fmt.Errorf("%w: a dry-run session, whose statements do not run", driver.ErrInvalidOption)
	}
	switch name := db.Dialector.Name(); name {
	case "postgres":
		// clock_timestamp(), not now(): now() is frozen at the start of
		// the transaction, which would make a lease taken inside a long
		// transaction end early or a takeover see a stale instant.
		// date_part is the epoch in seconds as a double: its rounding
		// and the product's stay under half a microsecond together
		// while the instant is under 2^32 seconds (until 2106-02-07), so
		// the cast, which rounds to the nearest, gives the exact
		// microsecond, the same value as extract(epoch ...), which is
		// numeric since PostgreSQL 14 and cost the server a twentieth of
		// the instructions of an uncontended lock cycle (three clock
		// reads in the acquisition, two in the release).
		return dialect{
			name:     name,
			now:      "(date_part('epoch', clock_timestamp())*1000000)::bigint",
			upsert:   true,
			greatest: "GREATEST",
		}, nil
	case "mysql":
		// TIMESTAMPDIFF from the epoch on UTC_TIMESTAMP is plain calendar
		// arithmetic: unlike UNIX_TIMESTAMP(NOW(6)) it does not go through
		// the session time zone, so a daylight-saving change cannot move it.
		return dialect{
			name:     name,
			now:      "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
			greatest: "GREATEST",
		}, nil
	case "sqlite":
		// SQLite keeps 'now' fixed for the whole step of one statement, so
		// the two strftime calls read the same instant. It has millisecond
		// resolution.
		return dialect{
			name:     name,
			now:      "(CAST(strftime('%s','now') AS INTEGER)*1000000 + CAST(substr(strftime('%f','now'),4) AS INTEGER)*1000)",
			upsert:   true,
			greatest: "max", // with two arguments, SQLite's max is scalar
		}, nil
	default:
		return dialect{}, fmt.Errorf("%w: gorm dialect %q (want postgres, mysql or sqlite)", driver.ErrUnsupported, name)
	}
}

// bind rewrites the ? placeholders of q as the driver wants them:
// PostgreSQL's drivers take $1, $2 and so on (gorm rewrites them itself,
// but statements sent to its connection pool directly must). The
// statements it is given hold no ? but placeholders.
func (d dialect) bind(q string) string {
	if d.name != "postgres" {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// quoteTable validates a table name (optionally schema-qualified) and quotes
// it for db. Table names cannot be bound as parameters, so they are spliced
// into the SQL: only plain identifiers are accepted.
func quoteTable(db *gorm.DB, table string) (string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%w: table name %q", driver.ErrInvalidOption, table)
	}
	for _, p := range parts {
		if !isIdentifier(p) {
			return "", fmt.Errorf("%w: table name %q: want letters, digits and underscores", driver.ErrInvalidOption, table)
		}
	}
	var b strings.Builder
	db.Dialector.QuoteTo(&b, table)
	return b.String(), nil
}

// quoteString writes s as a SQL string literal, its quotes doubled.
func quoteString(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

func isIdentifier(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
		case '0' <= r && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// retryable reports whether err is a conflict the database resolved by
// aborting this statement, so running it again is correct. InnoDB can pick
// an INSERT ... ON DUPLICATE KEY UPDATE as a deadlock victim when several
// clients insert the same new key at once. PostgreSQL refuses a statement
// whose transaction runs at REPEATABLE READ or SERIALIZABLE (a database's
// or a role's default_transaction_isolation) when a row it would update
// was updated since its snapshot, which every contended acquisition,
// release and renewal risks: run again, with a new snapshot, it decides on
// the row as it is. Its lock_timeout (a role's or a database's), like
// MySQL's lock wait timeout, refuses a statement that waited longer for a
// row lock, as behind a batch renewal of many rows, having run nothing.
// A connection whose server process was terminated (pg_terminate_backend,
// by an administrator, a pooler or a failover's fencing) while idle in the
// pool answers the next statement with the FATAL error (57P01) the process
// left behind, the statement unread: it runs again on another connection,
// where it failed the call, a release then leaving the lock taken until
// its TTL ran out. A statement pgx had prepared and the server no longer
// knows (26000, or 42P05 for a name taken) runs again once, at its first
// attempt (attempt 0): pgx drops the statement from its cache on the
// error and prepares it anew, so that a DEALLOCATE ALL of the application's
// refuses one run; refused again, the statement is taken to be behind a
// transaction pooler, where no rerun mends it (see pooledStatements).
//
// Not on pool a transaction (a *gorm.DB bound to the caller's): the
// database aborted the whole transaction, which running the statement again
// cannot mend (PostgreSQL refuses it, and MySQL, having rolled a
// deadlocked transaction back, would run it outside, in autocommit); the
// caller, who retries its transactions, is given the error.
//
// A statement refused for contention (a serialization failure or a
// deadlock) runs again after a pause, random and growing with attempt
// (see rerunPause): rerun at once, processes cycling one lock met the same
// contention again, and under SERIALIZABLE all ten runs were refused now
// and then on a busy machine. The pause ends with ctx, and the statement is
// then not run again. attempt counts the runs from 0, and the last of
// retries is followed by none: its refusal is reported at once, without a
// pause that would only delay the error (by up to 6.4ms).
//
// The MySQL driver's errors read "Error <number> (<state>): <message>" or
// "Error <number>: <message>"; matching that text rather than its type keeps
// programs on other databases from linking the driver.
func retryable(ctx context.Context, pool gorm.ConnPool, err error, attempt int) bool {
	if err == nil || attempt >= retries-1 {
		return false
	}
	if _, tx := pool.(gorm.TxCommitter); tx {
		return false
	}
	switch sqlState(err) {
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return rerunPause(ctx, attempt)
	case "55P03", "57P01": // lock_not_available, admin_shutdown
		return true
	case "26000", "42P05": // invalid_sql_statement_name, duplicate_prepared_statement
		return attempt == 0
	}
	switch mysqlNumber(err) {
	case 1205: // lock wait timeout
		return true
	case 1213: // deadlock
		return rerunPause(ctx, attempt)
	}
	return false
}

// rerunPause waits a random moment of up to 100µs << attempt (6.4ms at
// most), so that the processes a contention refused do not run again in
// step; false when ctx ended first.
func rerunPause(ctx context.Context, attempt int) bool {
	t := time.NewTimer(rand.N(100 * time.Microsecond << min(attempt, 6)))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// undefinedColumn reports whether err is PostgreSQL's undefined_column
// (SQLSTATE 42703).
func undefinedColumn(err error) bool { return sqlState(err) == "42703" }

// notFit explains err when the lock table does not fit the package: it is
// missing (Migrate never ran), or lacks a column its statements name
// (another table of the same name; PostgreSQL's waiting_until, which a
// table made by an earlier version lacks alone). No retry would find the
// table or the column, so it is an ErrInvalidOption (the table, WithTable's
// or the default, does not fit), not an ErrUnavailable that a waiting
// Acquire would retry until its context ended. It is nil for any other
// err.
func (l *Locker) notFit(err error) error {
	switch {
	case undefinedColumn(err) && strings.Contains(err.Error(), "waiting_until"):
		return fmt.Errorf("%w: the lock table %s has no waiting_until column (made by an earlier version): run Locker.Migrate, or the ALTER TABLE of the package documentation, to add it: %w",
			driver.ErrInvalidOption, l.table, err)
	case missingSchema(err):
		return notMigrated("lock", l.table, "run Locker.Migrate, or create it with the DDL of the package documentation", err)
	}
	return nil
}

// notMigrated says that the table of kind ("lock", "idempotency") that
// err refused is missing or lacks a column, and how to make it: fix. A
// table that names its schema is missing, on every database, when the
// schema is, which Migrate does not create.
func notMigrated(kind, table, fix string, err error) error {
	where := ""
	if strings.Contains(table, ".") {
		where = " (or the schema it names, which Migrate does not create)"
	}
	return fmt.Errorf("%w: the %s table %s%s is missing, or lacks a column of the package's: %s: %w",
		driver.ErrInvalidOption, kind, table, where, fix, err)
}

// missingSchema reports whether err is a database's refusal of a table or a
// column that does not exist: PostgreSQL's undefined_table and
// undefined_column, MySQL's errors 1146 and 1054, SQLite's "no such table",
// "no such column" and "has no column named", the last two read from
// their text as retryable reads MySQL's.
func missingSchema(err error) bool {
	switch sqlState(err) {
	case "42P01", "42703":
		return true
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		msg := e.Error()
		if strings.HasPrefix(msg, "Error 1146") || strings.HasPrefix(msg, "Error 1054") ||
			strings.Contains(msg, "no such table: ") || strings.Contains(msg, "no such column: ") || strings.Contains(msg, " has no column named ") {
			return true
		}
	}
	return false
}

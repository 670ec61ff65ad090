package sqllock

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"

	"gorm.io/gorm"
)

// scanRow runs q, a read of one row or none, and scans the row into dest;
// sql.ErrNoRows when there is none. It reads through gorm's Rows, not Row:
// Row returns a nil *sql.Row when a callback fails the statement (another
// plugin's, or a dry run's), and scanning that panics.
func scanRow(q *gorm.DB, dest ...any) error {
	rows, err := q.Rows()
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Close()
}

// queryRow runs query, which answers one row or none, and scans the row
// into dest, each a sql.Scanner; sql.ErrNoRows when there is none.
//
// On PostgreSQL it hands the statement to the driver's connection itself
// (driver.QueryerContext), taken from the pool for it, rather than through
// database/sql's rows: those start a goroutine and a cancellable context
// per query under a context that can be cancelled, as a lock's is, which
// cost the acquiring statement as much client time as the driver's own
// work. The pool, the driver, its prepared statement cache and ctx's
// cancellation are the same. A pool that is not a *sql.DB (a transaction)
// takes the usual path, and so does a statement the driver's connection
// did not send: one that is no driver.QueryerContext, or whose QueryContext
// itself returned driver.ErrSkip or driver.ErrBadConn (a connection found
// broken before sending), which database/sql then retries on another
// connection. An error met once the statement was sent, ErrBadConn from
// reading its rows included, is returned as it is: the statement may have
// run, and running it again would find its own work (an acquire its own
// lock, a release the lock already released).
func (l *Locker) queryRow(ctx context.Context, query string, args []any, dest ...any) error {
	if db, ok := l.pool.(*sql.DB); ok && l.d.name == "postgres" {
		err := queryDriver(ctx, db, query, args, dest)
		if !errors.Is(err, errNotSent) {
			return err
		}
	}
	return l.pool.QueryRowContext(ctx, query, args...).Scan(dest...)
}

// errNotSent marks a statement that queryDriver did not send.
var errNotSent = errors.New("the statement was not sent on the driver's connection")

func queryDriver(ctx context.Context, db *sql.DB, query string, args, dest []any) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	named := make([]sqldriver.NamedValue, len(args))
	for i, a := range args {
		named[i] = sqldriver.NamedValue{Ordinal: i + 1, Value: a}
	}
	return conn.Raw(func(dc any) error {
		q, ok := dc.(sqldriver.QueryerContext)
		if !ok {
			return errNotSent
		}
		rows, err := q.QueryContext(ctx, query, named)
		if errors.Is(err, sqldriver.ErrSkip) || errors.Is(err, sqldriver.ErrBadConn) {
			// Still ErrBadConn, so that database/sql discards the
			// connection.
			return fmt.Errorf("%w: %w", errNotSent, err)
		}
		if err != nil {
			return err
		}
		values := make([]sqldriver.Value, len(rows.Columns()))
		if err := rows.Next(values); err != nil {
			rows.Close()
			if errors.Is(err, io.EOF) {
				return sql.ErrNoRows
			}
			return err
		}
		if err := scanValues(values, dest); err != nil {
			rows.Close()
			return err
		}
		// Closing reads the statement's answer to its end, and reports
		// an error met after the row.
		return rows.Close()
	})
}

func scanValues(values []sqldriver.Value, dest []any) error {
	if len(values) != len(dest) {
		return fmt.Errorf("warden/sqllock: %d columns, want %d", len(values), len(dest))
	}
	for i, v := range values {
		s, ok := dest[i].(sql.Scanner)
		if !ok {
			return fmt.Errorf("warden/sqllock: scanning into %T", dest[i])
		}
		if err := s.Scan(v); err != nil {
			return err
		}
	}
	return nil
}

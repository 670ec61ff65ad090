package sqllock

import (
	"context"
	"errors"
	"fmt"

	"github.com/warden-go/warden/guard/driver"
)

// unavailable is driver.Unavailable for the errors of the package's
// statements, except the ones a connection pooler in front of PostgreSQL
// causes on every statement, which no retry mends (see pooledStatements).
func unavailable(ctx context.Context, err error) error {
	if pooledStatements(err) && ctx.Err() == nil {
		return fmt.Errorf("%w: %s: %w", driver.ErrInvalidOption, pooledStatementsFix, err)
	}
	return driver.Unavailable(ctx, err)
}

// pooledStatementsFix names the cause of pooledStatements' errors and the
// fix.
const pooledStatementsFix = "prepared statements do not survive the connection pooler in front of the database" +
	" (PgBouncer in transaction or statement pooling mode, before 1.21 or with max_prepared_statements = 0):" +
	" add default_query_exec_mode=exec to the DSN (or set PreferSimpleProtocol in gorm's postgres.Config)," +
	" and do not set gorm's PrepareStmt (whose statements a DEALLOCATE ALL on their connection leaves refused for good, pooler or not)"

// pooledStatements reports whether err is PostgreSQL's
// duplicate_prepared_statement (SQLSTATE 42P05) or
// invalid_sql_statement_name (26000). pgx prepares each statement on its
// connection under a name of its own and runs it by that name later (its
// default statement cache), as gorm's PrepareStmt does; a pooler that hands
// each transaction whichever server connection is free then sends the
// name to a server connection that never prepared it, or prepares it on
// one where another client already did. Neither statement ran, so the
// error is safe, but it comes back on any statement, at random: left an
// ErrUnavailable, a waiting Acquire would go on trying until its context
// ended, and a lease keeper would retry its renewals until the lease ran
// out, with no word of the cause. Without a pooler the error is a cache
// outliving the statement (an application's DEALLOCATE ALL). pgx's cache
// drops the statement, which, run again once (see retryable), succeeds.
// gorm's PrepareStmt cache does not: it keeps the *sql.Stmt, dead on that
// connection, and every later run of the statement there is refused again
// (gorm drops a statement on driver.ErrBadConn alone), so that the error
// reaching the caller is a pooler's or that one, and the fix names both.
// The package's own statements prepare nothing by name.
func pooledStatements(err error) bool {
	switch sqlState(err) {
	case "42P05", "26000":
		return true
	}
	return false
}

// sqlState is the SQLSTATE of err, a PostgreSQL error, or "". It is read
// through the SQLState method that pgx's *pgconn.PgError and lib/pq's
// *pq.Error share, so that the package links neither driver.
func sqlState(err error) string {
	if err == nil {
		// Before the variable errors.As needs, which escapes: a lock
		// cycle asks several times, with no error.
		return ""
	}
	var coded interface{ SQLState() string }
	if !errors.As(err, &coded) {
		return ""
	}
	return coded.SQLState()
}

package sqllock

import (
	sqldriver "database/sql/driver"
	"errors"
	"net"
	"strconv"
	"strings"

	"github.com/warden-go/warden/guard/driver"
)

// notSentOr is err, the failure of a forced release's or a record delete's
// statement, marked driver.NotSent when it proves that the statement changed
// nothing: no connection could be made for it (a dial refused or timed out),
// the driver failed before it sent a byte (database/sql/driver's ErrBadConn,
// which a driver may return only then, and pgx's SafeToRetry), or the
// database refused the write for the connection's sake or the user's
// (refusedWrite). database/sql sends a statement again only after
// ErrBadConn, and the package only after the database's answer that it ran
// nothing (retryable), so the last failure speaks for every attempt.
func notSentOr(err error) error {
	var (
		op   *net.OpError
		safe interface{ SafeToRetry() bool }
	)
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, sqldriver.ErrBadConn) ||
		errors.As(err, &safe) && safe.SafeToRetry() || refusedWrite(err) {
		return driver.NotSent(err)
	}
	return err
}

// refusedWrite reports whether err is a database's refusal to run a write
// on a read-only connection (a replica, a read-only transaction or server,
// an SQLite file opened read-only) or for a user not granted it. Such a
// refusal may come midway, as from a trigger that writes another table,
// and still changed nothing: the write is one statement, run alone in a
// session that autocommits, on a transactional table (on MySQL, Migrate
// requires both and Check checks them), and such a statement is undone
// whole when it fails. PostgreSQL's codes come with their SQLSTATE,
// MySQL's as "Error " and their number, SQLite's as its result code, told
// apart without linking any driver.
func refusedWrite(err error) bool {
	switch sqlState(err) {
	case "25006", "42501": // read_only_sql_transaction, insufficient_privilege
		return true
	}
	switch mysqlNumber(err) {
	case 1792, 1142, 1290: // a read-only transaction, a command denied, --read-only
		return true
	}
	// SQLITE_READONLY, or one of its extended codes.
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 8
}

// deniedPrivilege reports whether err is a database's refusal of a
// statement to a user not granted it (PostgreSQL's insufficient_privilege;
// MySQL's command, column and database access denied), which no retry
// outlasts: a setup to mend, where a read-only database (a standby until a
// failover ends) may pass.
func deniedPrivilege(err error) bool {
	if sqlState(err) == "42501" {
		return true
	}
	switch mysqlNumber(err) {
	case 1142, 1143, 1044:
		return true
	}
	return false
}

// mysqlNumber is the number of MySQL's error in err's chain (go-sql-driver's
// *mysql.MySQLError reads "Error 1290 (HY000): ..." or "Error 1290: ..."),
// 0 when there is none.
func mysqlNumber(err error) int {
	for e := err; e != nil; e = errors.Unwrap(e) {
		rest, ok := strings.CutPrefix(e.Error(), "Error ")
		if !ok {
			continue
		}
		digits, _, ok := strings.Cut(rest, ":")
		if d, _, found := strings.Cut(digits, " ("); found {
			digits, ok = d, true
		}
		if n, err := strconv.Atoi(digits); ok && err == nil && n > 0 {
			return n
		}
	}
	return 0
}

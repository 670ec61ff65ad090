package sqllock

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
)

// autocommits refuses a MySQL pool whose sessions do not autocommit
// (autocommit=0, as a DSN parameter, which the driver sets on every
// connection it opens, a server's default or its init_connect sets). Every
// statement of such a session opens a transaction that only a COMMIT ends:
// the Locker's acquisitions, renewals and releases, which it commits
// nowhere, would hold their row locks on a connection back in the pool and
// be undone when it closes, so that a release said done left the lock
// taken. The pool's sessions are all alike, so one connection's setting
// speaks for them. A db bound to a transaction is its caller's to commit,
// and is not asked. PostgreSQL and SQLite commit every statement outside a
// transaction: neither has a setting to stop that.
func autocommits(ctx context.Context, db *gorm.DB, d dialect) error {
	if d.name != "mysql" {
		return nil
	}
	if _, tx := db.Statement.ConnPool.(gorm.TxCommitter); tx {
		return nil
	}
	var on int64
	if err := db.WithContext(ctx).Raw("SELECT @@autocommit").Scan(&on).Error; err != nil {
		return unavailable(ctx, fmt.Errorf("reading the session's autocommit: %w", err))
	}
	if on == 0 {
		return fmt.Errorf("%w: the MySQL session has autocommit off (autocommit=0 in the DSN, or the server's default or init_connect):"+
			" the package's statements, which it commits nowhere, would stay uncommitted; leave autocommit on", driver.ErrInvalidOption)
	}
	return nil
}

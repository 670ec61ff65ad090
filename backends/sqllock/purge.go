package sqllock

import (
	"context"
	"fmt"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// MinPurgeIdle is the shortest idle time Purge accepts. A purged key's next
// token is the database's clock in microseconds, which is above every token
// the deleted row gave as long as that clock never steps back by more than
// the idle time; a minute is far beyond what NTP corrections do.
const MinPurgeIdle = time.Minute

// Purge deletes the rows of the lock table whose lease ended more than idle
// ago by the database's clock, a released lease counting as ended when it
// was taken (Release moves its end back to then), and returns how many it
// deleted. Release
// keeps a lock's row (it holds the lock's version, the fencing token), so
// without Purge the table keeps one row per key ever locked: where keys come
// from request data (httpmw.Lock per user, per order), clients can grow it
// at will. Run it now and then, an hour apart, say, from a scheduled job;
// from several processes at once is safe.
//
// Tokens never go backwards: a row is deleted only when its version is also
// more than idle below the database's now in microseconds, and a row
// inserted again starts its version there (see the package documentation,
// Leases). A held lock, or a row whose version ran ahead of the clock, is
// kept. A holder whose lease expired more than idle ago finds its row gone,
// which is what it would find had another taken the lock: ErrNotHeld.
//
// It pages through the table in primary-key order with plain reads and
// deletes each page's rows by name, the condition checked again, so that
// it locks only the rows it deletes: a single DELETE over the table would,
// on MySQL, lock every row it read until it ended, stalling acquisitions.
// Still, it reads the whole table (no index on the lease end, which would
// cost every acquisition and renewal an index write), and on PostgreSQL
// leaves dead rows for VACUUM. idle must be at least MinPurgeIdle.
func (l *Locker) Purge(ctx context.Context, idle time.Duration) (int64, error) {
	if idle < MinPurgeIdle {
		return 0, fmt.Errorf("%w: purge idle time %v, below the minimum %v", driver.ErrInvalidOption, idle, MinPurgeIdle)
	}
	now, us := l.d.now, idle.Microseconds()
	stale := "lock_until < " + now + " - ? AND version < " + now + " - ?"
	db := l.db.WithContext(ctx)
	var (
		deleted int64
		after   string
	)
	for {
		var names []string
		err := db.Raw("SELECT name FROM "+l.table+" WHERE name > ? AND "+stale+" ORDER BY name LIMIT ?",
			after, us, us, purgePage).Scan(&names).Error
		if err != nil {
			return deleted, unavailable(ctx, fmt.Errorf("purge %s: %w", l.rawTable, err))
		}
		if len(names) == 0 {
			return deleted, nil
		}
		for attempt := range retries {
			res := db.Exec("DELETE FROM "+l.table+" WHERE name IN ? AND "+stale, names, us, us)
			if err = res.Error; err == nil {
				deleted += res.RowsAffected
				break
			}
			if !retryable(ctx, l.pool, err, attempt) {
				break
			}
		}
		if err != nil {
			return deleted, unavailable(ctx, fmt.Errorf("purge %s: %w", l.rawTable, err))
		}
		after = names[len(names)-1]
	}
}

// purgePage is how many rows Purge deletes per statement.
const purgePage = 500

package sqllock

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
)

// lease is one holding: the lock row as this owner wrote it.
type lease struct {
	l       *Locker
	key     string
	owner   string // unique to this lease: the Locker's id and a counter
	version int64
	// expiry is Expiry in nanoseconds after epoch, so that a refresh can
	// move it while guard reads it.
	expiry atomic.Int64
}

// epoch anchors lease expiries on the monotonic clock.
var epoch = time.Now()

// expiryAllowance covers the database storing lock_until in whole
// microseconds, rounded down.
const expiryAllowance = time.Millisecond

func newLease(l *Locker, key, owner string, version int64, ttl time.Duration, sent time.Time) *lease {
	ls := &lease{l: l, key: key, owner: owner, version: version}
	ls.renewed(sent, ttl)
	return ls
}

// renewed records that a statement sent at sent set the row's lock_until to
// the database's now plus ttl. The database ran it after sent, so the lease
// lasts at least until sent + ttl on any clock that runs at the rate of the
// database's, whatever the two clocks read.
func (ls *lease) renewed(sent time.Time, ttl time.Duration) {
	ls.expiry.Store(int64(sent.Sub(epoch) + ttl - expiryAllowance))
}

// Token implements driver.Lease: the row's version, which only grows since
// the row is never deleted.
func (ls *lease) Token() uint64 { return uint64(ls.version) }

// Expiry implements driver.Lease.
func (ls *lease) Expiry() time.Time { return epoch.Add(time.Duration(ls.expiry.Load())) }

// Refresh implements driver.Lease. The row is extended only while it is still
// this owner's and unexpired by the database's clock.
func (ls *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	l := ls.l
	sent := time.Now()
	held, err := ls.exec(ctx, l.q.refresh, ttl.Microseconds(), ls.key, ls.owner, ls.version)
	if err == nil && !held && l.d.name == "mysql" {
		// MySQL counts changed rows, not matched ones: a refresh that
		// wrote the very same lock_until reports zero. Ask again.
		held, err = ls.stillHeld(ctx)
	}
	if err != nil {
		return driver.Unavailable(ctx, err)
	}
	if !held {
		return fmt.Errorf("%w: expired or taken over", driver.ErrNotHeld)
	}
	ls.renewed(sent, ttl)
	return nil
}

// Release implements driver.Lease. It moves the row's expiry to now and keeps
// the row, so the version goes on growing. On PostgreSQL the release is
// announced on the table's channel, waking a waiter at once: by the same
// statement, or, when this Locker had waiters lately, by a statement a
// moment later, unless an attempt of this Locker finds the lock taken again
// first (see announcer).
func (ls *lease) Release(ctx context.Context) error {
	l := ls.l
	args := []any{ls.key, ls.owner, ls.version}
	query, deferred := l.q.release, l.channel != "" && l.notes.hot()
	switch {
	case deferred:
		query = l.q.quietRelease
	case l.channel != "":
		args = append(args, l.channel)
	}
	held, err := ls.exec(ctx, query, args...)
	if err != nil {
		return driver.Unavailable(ctx, err)
	}
	if !held {
		return fmt.Errorf("%w: expired or taken over before release", driver.ErrNotHeld)
	}
	if deferred {
		l.announcer.after(l, ls.key)
	}
	return nil
}

func (ls *lease) stillHeld(ctx context.Context) (bool, error) {
	var n int64
	err := ls.l.db.WithContext(ctx).Raw(ls.l.q.holds, ls.key, ls.owner, ls.version).Row().Scan(&n)
	return n > 0, err
}

// exec runs an owner-checked UPDATE and reports whether it matched the row,
// running it again when the database aborted it to break a deadlock.
func (ls *lease) exec(ctx context.Context, query string, args ...any) (bool, error) {
	var err error
	for range retries {
		res := ls.l.db.WithContext(ctx).Exec(query, args...)
		if err = res.Error; err == nil {
			return res.RowsAffected > 0, nil
		}
		if !retryable(err) {
			break
		}
	}
	return false, err
}

// batchSize bounds the leases one statement refreshes: two parameters each,
// well under the 32,766 SQLite allows and the 65,535 of PostgreSQL and
// MySQL.
const batchSize = 10_000

// RefreshBatch implements driver.BatchRefresher: one UPDATE per batchSize
// leases (with RETURNING on PostgreSQL and SQLite; followed by one SELECT
// on MySQL, which has none) extends every row that is still its owner's.
func (l *Locker) RefreshBatch(ctx context.Context, leases []driver.Lease, ttl time.Duration) []error {
	errs := make([]error, len(leases))
	mine := make([]*lease, 0, len(leases))
	at := make([]int, 0, len(leases))
	for i, g := range leases {
		ls, ok := g.(*lease)
		if !ok || ls.l != l {
			errs[i] = fmt.Errorf("%w: the lease was not granted by this Locker", driver.ErrInvalidOption)
			continue
		}
		mine, at = append(mine, ls), append(at, i)
	}
	for start := 0; start < len(mine); start += batchSize {
		end := min(start+batchSize, len(mine))
		held, sent, err := l.refreshChunk(ctx, mine[start:end], ttl)
		for j, ls := range mine[start:end] {
			i := at[start+j]
			switch {
			case err != nil:
				errs[i] = driver.Unavailable(ctx, err)
			case held[ls.owner]:
				ls.renewed(sent, ttl)
			default:
				errs[i] = fmt.Errorf("%w: expired or taken over", driver.ErrNotHeld)
			}
		}
	}
	return errs
}

// refreshChunk extends the rows of leases and returns the owners whose rows
// were still theirs, and when the statement was sent.
func (l *Locker) refreshChunk(ctx context.Context, leases []*lease, ttl time.Duration) (map[string]bool, time.Time, error) {
	var update, check string
	var args []any
	missed := l.d.name == "postgres" // the statement answers with the owners not extended
	if missed {
		update, args = l.refreshArrays(leases, ttl)
	} else {
		update, check, args = l.refreshList(leases, ttl)
	}
	rows := make(map[string]bool)
	sent := time.Now()
	db := l.db.WithContext(ctx)
	var err error
	for range retries {
		clear(rows)
		if check != "" {
			// No RETURNING: read back which rows are this owner's and
			// unexpired, which after the UPDATE are those it extended.
			if err = db.Exec(update, args...).Error; err == nil {
				err = owners(db.Raw(check, args[1:]...), rows)
			}
		} else {
			err = owners(db.Raw(update, args...), rows)
		}
		if err == nil || !retryable(err) {
			break
		}
	}
	if err != nil || !missed {
		return rows, sent, err
	}
	held := make(map[string]bool, len(leases))
	for _, ls := range leases {
		if !rows[ls.owner] {
			held[ls.owner] = true
		}
	}
	return held, sent, nil
}

// refreshArrays is PostgreSQL's batch refresh: the names and owners go as
// two array parameters, so the statement stays small and PostgreSQL parses
// and plans it in no time whatever the batch's size (the arrays are sent as
// text literals, which any driver passes through), and it answers with the
// owners it did not extend, none in the usual case, so that a large batch
// costs the client next to nothing to read.
func (l *Locker) refreshArrays(leases []*lease, ttl time.Duration) (string, []any) {
	names := make([]string, len(leases))
	owners := make([]string, len(leases))
	for i, ls := range leases {
		names[i], owners[i] = ls.key, ls.owner
	}
	// owner is unique to a lease, so (name, owner) names one holding.
	q := "WITH v AS (SELECT * FROM unnest(?::text[], ?::text[]) AS v(name, owner))," +
		" u AS (UPDATE " + l.table + " AS t SET lock_until = " + l.d.now + " + ? FROM v" +
		" WHERE t.name = v.name AND t.owner = v.owner AND t.lock_until > " + l.d.now + " RETURNING t.owner)" +
		" SELECT owner FROM v WHERE owner NOT IN (SELECT owner FROM u)"
	return q, []any{arrayLiteral(names), arrayLiteral(owners), ttl.Microseconds()}
}

// refreshList is the batch refresh of SQLite (with RETURNING) and MySQL
// (with a SELECT after it): a list of (name, owner) rows.
func (l *Locker) refreshList(leases []*lease, ttl time.Duration) (update, check string, args []any) {
	var in strings.Builder
	args = make([]any, 0, 1+2*len(leases))
	args = append(args, ttl.Microseconds())
	if l.d.name != "mysql" {
		// SQLite reads a row-value list only as a VALUES table.
		in.WriteString("VALUES ")
	}
	for i, ls := range leases {
		if i > 0 {
			in.WriteString(", ")
		}
		in.WriteString("(?, ?)")
		args = append(args, ls.key, ls.owner)
	}
	where := " WHERE (name, owner) IN (" + in.String() + ") AND lock_until > " + l.d.now
	update = "UPDATE " + l.table + " SET lock_until = " + l.d.now + " + ?" + where
	if l.d.name == "mysql" {
		return update, "SELECT owner FROM " + l.table + where, args
	}
	return update + " RETURNING owner", "", args
}

// arrayLiteral writes ss as a PostgreSQL text[] literal, every element
// quoted, backslashes and quotes escaped.
func arrayLiteral(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// owners collects the owner column of q's rows.
func owners(q *gorm.DB, into map[string]bool) error {
	rows, err := q.Rows()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var owner string
		if err := rows.Scan(&owner); err != nil {
			return err
		}
		into[owner] = true
	}
	return rows.Err()
}

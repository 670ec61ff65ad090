package sqllock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warden-go/warden/guard/driver"
)

var (
	_ driver.Inspector     = (*Locker)(nil)
	_ driver.Lister        = (*Locker)(nil)
	_ driver.ForceReleaser = (*Locker)(nil)
)

// ownerWidth is the width of the owner column, in bytes at most (the
// databases count characters, which are never more).
const ownerWidth = 255

// labelSep ends a lease's own id in the owner column; the holder's label
// (AcquireOptions.Owner) follows it. Labels have no control characters, so
// the last tab is the separator whatever the Locker's id (WithOwner accepts
// any bytes) holds, and keeping the label there needs no schema change.
const labelSep = "\t"

// labelled is the owner value of a lease whose own id is id and whose
// holder is labelled label. An id too long to leave room for the label is
// replaced by a digest of it: the id only has to be unique, which 128 bits
// of SHA-256 keep.
func labelled(id, label string) string {
	if len(id)+len(labelSep)+len(label) > ownerWidth {
		sum := sha256.Sum256([]byte(id))
		id = "sha256:" + hex.EncodeToString(sum[:16])
	}
	return id + labelSep + label
}

// labelOf is the label kept in an owner value, "" when there is none (rows
// written without one).
func labelOf(owner string) string {
	i := strings.LastIndex(owner, labelSep)
	if i < 0 {
		return ""
	}
	return owner[i+len(labelSep):]
}

// Inspect implements driver.Inspector with one read of the lock's row. The
// holding's TTL is what is left of the row's lease by the database's clock;
// Waiters is -1, since waiters poll (or listen) instead of queueing in the
// table.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	if err := checkKey(key); err != nil {
		return driver.Inspection{}, err
	}
	h, _, ok, err := l.holding(ctx, key)
	if err != nil {
		return driver.Inspection{}, err
	}
	in := driver.Inspection{Waiters: -1}
	if ok {
		in.Holders = []driver.Holding{h}
	}
	return in, nil
}

// holding reads key's live holder and its full owner value.
func (l *Locker) holding(ctx context.Context, key string) (driver.Holding, string, bool, error) {
	now := l.d.now
	var (
		owner   string
		version int64
		micros  int64
	)
	err := scanRow(l.db.WithContext(ctx).Raw("SELECT owner, version, lock_until - "+now+" FROM "+l.table+
		" WHERE name = ? AND lock_until > "+now, key), &owner, &version, &micros)
	if errors.Is(err, sql.ErrNoRows) || err == nil && micros <= 0 {
		return driver.Holding{}, "", false, nil
	}
	if err != nil {
		return driver.Holding{}, "", false, unavailable(ctx, err)
	}
	return held(owner, version, micros), owner, true, nil
}

func held(owner string, version, micros int64) driver.Holding {
	return driver.Holding{Owner: labelOf(owner), Token: uint64(version), TTL: time.Duration(micros) * time.Microsecond}
}

// byteOrder is the form of the name column, and of List's bounds, that
// compares and sorts byte by byte, as Go strings do. On PostgreSQL the
// default collation follows the locale's rules instead, so the name is
// collated "C"; and a bound text cannot carry (invalid UTF-8, as a prefix
// cut partway through a character is, or a NUL byte) is compared with the
// name's UTF-8 bytes as bytea, which sort the same way but cost the server
// about twice the time per page (measured over 50,000 rows), so only then.
// MySQL's VARBINARY (see Tables) and SQLite's BINARY collation compare bytes
// already, and take any bounds as they are.
func (l *Locker) byteOrder(prefix, after string) (name string, from, past any) {
	switch {
	case l.d.name != "postgres":
		return "name", prefix, after
	case isText(prefix) && isText(after):
		return `name COLLATE "C"`, prefix, after
	}
	return "convert_to(name, 'UTF8')", []byte(prefix), []byte(after)
}

// isText reports whether PostgreSQL's text can hold s.
func isText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// List implements driver.Lister with one range read of the lock table in
// key order; prefix and after may be any bytes. On MySQL and SQLite it walks
// the primary key; on PostgreSQL the byte order it needs (byteOrder) keeps
// the key's index out unless the column is collated "C" already, so the live
// rows under prefix are sorted for each page. Waiters is -1 for every key, as
// for Inspect.
func (l *Locker) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: list limit %d", driver.ErrInvalidOption, limit)
	}
	name, from, past := l.byteOrder(prefix, after)
	now := l.d.now
	// One row more than a page: on MySQL, whose collation pads with spaces,
	// a key equal to prefix but for its trailing spaces sorts among the
	// keys under it without being one, and is skipped below.
	rows, err := l.db.WithContext(ctx).Raw("SELECT name, owner, version, lock_until - "+now+" FROM "+l.table+
		" WHERE "+name+" >= ? AND "+name+" > ? AND lock_until > "+now+" ORDER BY "+name+" LIMIT ?",
		from, past, limit+1).Rows()
	if err != nil {
		return nil, unavailable(ctx, err)
	}
	defer rows.Close()
	var out []driver.Listed
	for len(out) < limit && rows.Next() {
		var (
			key, owner      string
			version, micros int64
		)
		if err := rows.Scan(&key, &owner, &version, &micros); err != nil {
			return nil, unavailable(ctx, err)
		}
		if key <= after || key < prefix || micros <= 0 {
			continue
		}
		if !strings.HasPrefix(key, prefix) {
			break // the keys under prefix sort together, and these are past them
		}
		out = append(out, driver.Listed{Key: key, Inspection: driver.Inspection{
			Holders: []driver.Holding{held(owner, version, micros)},
			Waiters: -1,
		}})
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable(ctx, err)
	}
	return out, nil
}

// ForceRelease implements driver.ForceReleaser. A holding's token is its
// row's version, which every grant moves and nothing else reuses (rows are
// never deleted), so the version names one holding. In one statement,
// checked against the holder it read (owner id and version: a holder that
// left in between, or its successor, is never touched), it ends the row's
// lease at the database's now, advances the version and clears the owner.
// When that holder is not the one target names, or the statement finds it
// gone, nothing is changed and the row is read again to say who holds the
// lock instead; with target.AnyHolder the holder read is taken, whoever it
// is, and a holder gone meanwhile sends it back to read again.
//
// The next grant takes the row over with the version after that, so its
// token is greater than the old holder's; and every statement of the old
// holder names its owner id, most also its version, so none matches the row
// again, whatever the database's clock does next: its next Refresh (or
// batch refresh) and its Release return driver.ErrNotHeld, saying that
// ForceRelease took the lock, which the row's empty owner and the version
// one past the holder's tell (see Locker.notHeld). On PostgreSQL
// the statement also notifies the lock table's channel, as a release does,
// so that waiters that listen try at once.
func (l *Locker) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	now := l.d.now
	q := "UPDATE " + l.table + " SET owner = '', version = version + 1, lock_until = " + now +
		" WHERE name = ? AND owner = ? AND version = ? AND lock_until > " + now
	if l.channel != "" {
		q = "WITH r AS (" + q + " RETURNING name) SELECT pg_notify(?, r.name) FROM r"
	}
	for {
		h, owner, ok, err := l.holding(ctx, key)
		if err != nil || !ok {
			// Nothing was changed: the release is sent after the read,
			// and one sent before it found no row to change.
			return nil, driver.NotSent(err)
		}
		if !target.AnyHolder && !target.Matches(h) {
			return nil, driver.HolderChanged([]driver.Holding{h})
		}
		args := []any{key, owner, int64(h.Token)}
		if l.channel != "" {
			args = append(args, l.channel)
		}
		var taken bool
		for attempt := range retries {
			res := l.db.WithContext(ctx).Exec(q, args...)
			if err = res.Error; err == nil {
				// The version changes, so even MySQL, which counts
				// changed rows, counts the row.
				taken = res.RowsAffected > 0
				break
			}
			if !retryable(ctx, l.pool, err, attempt) {
				break
			}
		}
		if err != nil {
			return nil, unavailable(ctx, notSentOr(err))
		}
		if taken {
			return []driver.Holding{h}, nil
		}
		// The holder left, or its lease ended, after it was read: look
		// again.
	}
}

package sqllock

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
)

// lease is one holding: the lock row as this owner wrote it.
type lease struct {
	l   *Locker
	key string
	// seq and label make the row's owner value (Locker.ownerOf), kept
	// instead of the value itself: that would be one more allocation per
	// held lock, the size of the Locker's id, for statements that a held
	// lock sends once (the release) or never (renewals send the id once
	// per batch).
	seq     uint64
	label   string
	version int64
	// expiry is Expiry in nanoseconds after epoch, so that a refresh can
	// move it while guard reads it.
	expiry atomic.Int64
	// released is set once Release freed the row: a batch renewal that
	// raced with the release is told why it was not extended without a
	// query (see Locker.notHeld), as a lease released while its renewal
	// was under way is no rare case.
	released atomic.Bool
}

// epoch anchors lease expiries on the monotonic clock.
var epoch = time.Now()

// expiryAllowance covers the database storing lock_until in whole
// microseconds, rounded down.
const expiryAllowance = time.Millisecond

func newLease(l *Locker, key string, seq uint64, label string, version int64, ttl time.Duration, sent time.Time) *lease {
	ls := &lease{l: l, key: key, seq: seq, label: label, version: version}
	ls.renewed(sent, ttl)
	return ls
}

// renewed records that a statement sent at sent set the row's lock_until to
// the database's now plus ttl. The database ran it after sent, so the lease
// lasts at least until sent + ttl on any clock that runs at the rate of the
// database's, whatever the two clocks read.
func (ls *lease) renewed(sent time.Time, ttl time.Duration) {
	// Add and Sub saturate where a sum would overflow: a TTL of
	// math.MaxInt64 was an expiry in the past.
	ls.expiry.Store(int64(sent.Add(ttl - expiryAllowance).Sub(epoch)))
}

// owner is the lease's value of the owner column.
func (ls *lease) owner() string { return ls.l.ownerOf(ls.seq, ls.label) }

// Token implements driver.Lease: the row's version, which only grows since
// the row is never deleted.
func (ls *lease) Token() uint64 { return uint64(ls.version) }

// Expiry implements driver.Lease.
func (ls *lease) Expiry() time.Time { return epoch.Add(time.Duration(ls.expiry.Load())) }

// Refresh implements driver.Lease. The row is extended only while it is still
// this owner's and unexpired by the database's clock.
func (ls *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := checkTTL(ttl); err != nil {
		return err
	}
	l := ls.l
	sent := time.Now()
	held, err := ls.exec(ctx, l.q.refresh, ttl.Microseconds(), ls.key, ls.owner(), ls.version)
	if err == nil && !held && l.d.name == "mysql" {
		// MySQL counts changed rows, not matched ones: a refresh that
		// wrote the very same lock_until reports zero. Ask again.
		held, err = ls.stillHeld(ctx)
	}
	if err != nil {
		return unavailable(ctx, err)
	}
	if !held {
		return ls.notHeld(ctx, "")
	}
	ls.renewed(sent, ttl)
	return nil
}

// Release implements driver.Lease. It moves the row's expiry to now and keeps
// the row, so the version goes on growing. On PostgreSQL, when a waiter that
// listens marked the row as waited for, the release is announced on the
// table's channel, waking a waiter at once: by the same statement, or, when
// this Locker had waiters lately, by a statement a moment later, unless an
// attempt of this Locker finds the lock taken again first (see announcer).
func (ls *lease) Release(ctx context.Context) error {
	l := ls.l
	var (
		held   bool
		waited sql.NullBool
		err    error
		owner  = ls.owner()
	)
	switch {
	case l.channel == "":
		held, err = ls.exec(ctx, l.q.release, ls.key, owner, ls.version)
	case l.notes.hot():
		err = l.queryRow(ctx, l.q.quietRelease, []any{ls.key, owner, ls.version}, &waited)
		held = err == nil
		if errors.Is(err, sql.ErrNoRows) {
			err = nil // not this owner's to release
		}
	default:
		held, err = ls.exec(ctx, l.q.notifyRelease, ls.key, owner, ls.version)
	}
	if l.channel != "" && undefinedColumn(err) {
		// A table of an earlier version, not migrated: the plain release
		// names no waiting_until, and no waiter of this version can have
		// marked the row (its marking attempt fails the same way), so it
		// loses no notification that one would have sent. The failed
		// statement changed nothing; in a transaction it aborted it,
		// and then the fallback fails too.
		missing := err
		waited = sql.NullBool{}
		if held, err = ls.exec(ctx, l.q.release, ls.key, owner, ls.version); err != nil {
			return l.notFit(missing)
		}
	}
	if err != nil {
		return unavailable(ctx, err)
	}
	if !held {
		return ls.notHeld(ctx, " before release")
	}
	ls.released.Store(true)
	if waited.Bool {
		l.announcer.after(ls.key)
	}
	return nil
}

func (ls *lease) stillHeld(ctx context.Context) (bool, error) {
	var n int64
	err := ls.l.pool.QueryRowContext(ctx, ls.l.q.holds, ls.key, ls.owner(), ls.version).Scan(&n)
	return n > 0, err
}

// exec runs an owner-checked UPDATE and reports whether it matched the row,
// running it again when the database aborted it to break a deadlock.
func (ls *lease) exec(ctx context.Context, query string, args ...any) (bool, error) {
	var err error
	for attempt := range retries {
		var res sql.Result
		if res, err = ls.l.pool.ExecContext(ctx, query, args...); err == nil {
			n, err := res.RowsAffected()
			return n > 0, err
		}
		if !retryable(ctx, ls.l.pool, err, attempt) {
			break
		}
	}
	return false, err
}

// RefreshBatch implements driver.BatchRefresher: one UPDATE per chunk of
// leases extends every row that is still its owner's, the chunks sent at
// once on connections of their own. PostgreSQL takes a chunk's names and
// owners as two array parameters, and MySQL and MariaDB as one JSON
// parameter read by JSON_TABLE, so a chunk holds up to 50,000 leases and
// 100,000 cost two statements. On PostgreSQL the statement answers with
// the leases it did not extend, so it is all a chunk costs; on MySQL and
// MariaDB the UPDATE's row count says whether every lease was extended,
// and only when one was not does a SELECT find which. SQLite, and MySQL before 8.0.4 or MariaDB before 10.6, which have no
// JSON_TABLE, take a list of parameters, two a lease, as many as their
// statements allow: the package keeps working on those servers (MySQL
// 5.7, MariaDB 10.2), where only Migrate's ADD COLUMN of waiting_until
// rebuilds the table instead of being instant (see the package
// documentation).
func (l *Locker) RefreshBatch(ctx context.Context, leases []driver.Lease, ttl time.Duration) []error {
	errs := make([]error, len(leases))
	if err := checkTTL(ttl); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	// The positions of this Locker's leases, in key order: a statement
	// then looks its rows up in the order of the primary key's index,
	// each lookup reading the pages the last one read, a third less of
	// the server's time per row on PostgreSQL. They are the batch's only
	// copy of its leases, four bytes each, as it is heap held while the
	// batch is in flight (a batch of 2^31 leases, past int32, would be
	// 32 GiB of interface values to begin with).
	order := make([]int32, 0, len(leases))
	for i, g := range leases {
		if ls, ok := g.(*lease); !ok || ls.l != l {
			errs[i] = fmt.Errorf("%w: the lease was not granted by this Locker", driver.ErrInvalidOption)
			continue
		}
		order = append(order, int32(i))
	}
	all := batch{leases: leases, order: order}
	slices.SortFunc(order, func(a, b int32) int {
		return strings.Compare(leases[a].(*lease).key, leases[b].(*lease).key)
	})
	parallel := 4
	if l.d.name == "sqlite" {
		parallel = 1 // one writer at a time
	}
	var (
		wg    sync.WaitGroup
		slots = make(chan struct{}, parallel)
	)
	for start, end := 0, 0; start < len(order); start = end {
		end = start + l.chunk(all.slice(start, len(order)))
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			chunk := all.slice(start, end)
			missed, sent, err := l.refreshChunk(ctx, chunk, ttl)
			var lost []int32
			for j, i := range chunk.order {
				switch {
				case err != nil:
					errs[i] = unavailable(ctx, err)
				case missed == nil || !missed[j]:
					chunk.at(j).renewed(sent, ttl)
				default:
					lost = append(lost, i)
				}
			}
			if len(lost) > 0 {
				gone := make([]*lease, len(lost))
				for j, i := range lost {
					gone[j] = leases[i].(*lease)
				}
				for j, err := range l.notHeld(ctx, gone, "") {
					errs[lost[j]] = err
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// batch is a run of a RefreshBatch's leases in key order: its j-th lease is
// leases[order[j]], one of the Locker's own.
type batch struct {
	leases []driver.Lease
	order  []int32
}

func (b batch) len() int             { return len(b.order) }
func (b batch) at(j int) *lease      { return b.leases[b.order[j]].(*lease) }
func (b batch) slice(i, j int) batch { return batch{b.leases, b.order[i:j]} }

const (
	// maxChunk is the most leases one refreshing statement takes: 100,000
	// leases go in two statements, run at once, so on two connections and
	// two server processes, and no statement holds row locks on more rows
	// than that.
	maxChunk = 50_000
	// maxChunkBytes bounds the names and owners one statement carries,
	// well under MySQL's and MariaDB's default max_allowed_packet (16 or
	// 64 MiB), which a long-keyed chunk could otherwise reach.
	maxChunkBytes = 8 << 20
	// maxListChunk is the most leases a statement with a parameter list
	// takes: two parameters each, under the 32,766 SQLite allows (and the
	// 65,535 of MySQL).
	maxListChunk = 16_000
)

// chunk is how many of b's leases, from the first, the next refreshing
// statement takes.
func (l *Locker) chunk(b batch) int {
	if l.d.name == "sqlite" || (l.d.name == "mysql" && l.noJSONTable.Load()) {
		return min(b.len(), maxListChunk)
	}
	size := 0
	for j := range b.len() {
		// The owner value is at most the Locker's id, a separator, 20
		// digits, labelSep and the label (shorter when hashed).
		ls := b.at(j)
		n := len(ls.key) + len(l.owner) + 22 + len(ls.label)
		if j == maxChunk || (j > 0 && size+n > maxChunkBytes) {
			return j
		}
		size += n
	}
	return b.len()
}

// refreshChunk extends the rows of leases and reports which of leases it
// did not extend, by position (nil when it extended all), and when the
// statement was sent.
func (l *Locker) refreshChunk(ctx context.Context, leases batch, ttl time.Duration) ([]bool, time.Time, error) {
	sent := time.Now()
	db := l.db.WithContext(ctx)
	var (
		missed []bool
		err    error
	)
	for attempt := range retries {
		var r refreshing
		switch {
		case l.d.name == "postgres":
			r = l.refreshArrays(leases, ttl)
		case l.d.name == "mysql" && !l.noJSONTable.Load():
			if r, err = l.refreshJSON(leases, ttl); err != nil {
				return nil, sent, err
			}
		default:
			r = l.refreshList(leases, ttl)
		}
		missed = nil
		switch {
		case r.positions:
			missed, err = missedAt(db.Raw(r.update, r.args...), leases.len())
		case r.check == "":
			missed, err = missedOwners(db.Raw(r.update, r.args...), leases)
		default:
			res := db.Exec(r.update, r.args...)
			if err = res.Error; err == nil && res.RowsAffected < int64(leases.len()) {
				// Some row was not extended (MySQL counts the rows
				// changed, fewer still when one was extended to the
				// very instant it had): read back which rows are this
				// owner's and unexpired, which after the UPDATE are
				// those it extended, since a row it did not extend can
				// no longer become theirs.
				missed, err = missedOwners(db.Raw(r.check, r.checkArgs...), leases)
			}
		}
		if err != nil && l.d.name == "mysql" && !l.noJSONTable.Load() && noJSONTable(err) {
			l.noJSONTable.Store(true)
			return l.refreshChunk(ctx, leases, ttl)
		}
		if err == nil || !retryable(ctx, l.pool, err, attempt) {
			break
		}
	}
	return missed, sent, err
}

// refreshing is one batch refresh: an UPDATE and the SELECT that finds the
// leases it extended, empty when the UPDATE returns their owners itself, or
// with positions the positions of those it did not extend.
type refreshing struct {
	update, check   string
	args, checkArgs []any
	positions       bool
}

// refreshArrays is PostgreSQL's batch refresh: the names and owners go as
// two array parameters, so the statement stays small and PostgreSQL parses
// and plans it in no time whatever the batch's size (the arrays are sent as
// text literals, which any driver passes through). unnest pairs them up and
// the primary key's index finds each row, so the work is linear in the
// batch, not in the table, which keeps a row for every key ever locked
// ("owner = ANY(array)" would compare each row with the whole array,
// seconds for 20,000 leases). The arrays are read through scalar
// subqueries so that the planner cannot see their length: seeing it, as it
// does in the custom plans it makes for the first five runs of a prepared
// statement on each connection, it hashed the batch and scanned the whole
// table (330,000 rows for 5,000 leases: 1.7s on a loaded server, past the
// time the keeper gives a renewal). The database's clock is read once.
//
// The statement answers with the positions in the chunk of the leases it
// did not extend, by comparing the count of rows it updated with the
// chunk's (only a short count costs a set difference), rather than leaving
// that to a second statement: every period in which a lease of the chunk
// had been released took two full passes over the chunk and two round
// trips, and a second statement cut off by the keeper's deadline failed a
// chunk whose rows the first had already extended (seen as the whole
// chunk lost while 100,000 locks were being released).
func (l *Locker) refreshArrays(leases batch, ttl time.Duration) refreshing {
	stem, names, prefix, owners := l.arrays(leases)
	n := leases.len()
	return refreshing{
		update: "WITH c AS MATERIALIZED (SELECT " + l.d.now + " AS now)," +
			" u AS (UPDATE " + l.table + " AS t SET lock_until = c.now + ? FROM c," +
			" unnest((SELECT ?::text[]), (SELECT ?::text[])) WITH ORDINALITY AS v(name, owner, i)" +
			" WHERE t.name = ?::text || v.name AND t.owner = ?::text || v.owner AND t.lock_until > c.now RETURNING v.i)," +
			" n AS (SELECT count(*) AS n FROM u)" +
			" SELECT g FROM n, generate_series(1, ?::bigint) AS g WHERE n.n < ?" +
			" EXCEPT ALL SELECT i FROM u, n WHERE n.n < ?",
		args:      []any{ttl.Microseconds(), names, owners, stem, prefix, n, n, n},
		positions: true,
	}
}

// arrays writes the names and owner values of leases as two PostgreSQL
// text[] literals, every element quoted, backslashes and quotes escaped,
// each literal in one allocation of its size. Each goes without the prefix
// its elements share, which goes once (stem for the names, prefix for the
// owner values): pgx keeps the arguments of a statement on its connection,
// as given and as encoded, for some statements after it, so the literals
// are heap held between renewals as well as in flight, and the shared part
// is most of each element (the Locker's id, and the Guard's and the
// application's prefixes of the keys). The owner values' prefix is the
// Locker's id and "/", or empty in a chunk with a lease whose value does
// not begin so (its id hashed, see labelled). The names' is the longest
// all share, cut back to whole characters.
func (l *Locker) arrays(leases batch) (stem, names, prefix, owners string) {
	prefix = l.owner + "/"
	stem = leases.at(0).key
	for j := range leases.len() {
		ls := leases.at(j)
		if l.hashesOwner(ls.seq, ls.label) {
			prefix = ""
		}
		i := 0
		for i < len(stem) && i < len(ls.key) && stem[i] == ls.key[i] {
			i++
		}
		stem = stem[:i]
	}
	for !utf8.ValidString(stem) {
		stem = stem[:len(stem)-1]
	}
	nsize, osize := 2, 2
	for j := range leases.len() {
		ls := leases.at(j)
		nsize += len(ls.key) - len(stem) + 3
		osize += digits(ls.seq) + len(labelSep) + len(ls.label) + 3
	}
	if prefix == "" {
		osize += leases.len() * len(l.owner)
	}
	var nb, ob strings.Builder
	nb.Grow(nsize)
	ob.Grow(osize)
	nb.WriteByte('{')
	ob.WriteByte('{')
	var num [20]byte
	for j := range leases.len() {
		ls := leases.at(j)
		if j > 0 {
			nb.WriteByte(',')
			ob.WriteByte(',')
		}
		nb.WriteByte('"')
		writeEscaped(&nb, ls.key[len(stem):])
		nb.WriteByte('"')
		ob.WriteByte('"')
		if prefix == "" {
			writeEscaped(&ob, ls.owner())
		} else {
			ob.Write(strconv.AppendUint(num[:0], ls.seq, 10))
			ob.WriteString(labelSep)
			writeEscaped(&ob, ls.label)
		}
		ob.WriteByte('"')
	}
	nb.WriteByte('}')
	ob.WriteByte('}')
	return stem, nb.String(), prefix, ob.String()
}

// writeEscaped writes s as the inside of a quoted element of a PostgreSQL
// array literal: backslashes and quotes escaped.
func writeEscaped(b *strings.Builder, s string) {
	for {
		i := strings.IndexAny(s, `"\`)
		if i < 0 {
			b.WriteString(s)
			return
		}
		b.WriteString(s[:i])
		b.WriteByte('\\')
		b.WriteByte(s[i])
		s = s[i+1:]
	}
}

// refreshJSON is MySQL's and MariaDB's batch refresh: the (name, owner)
// pairs go as one JSON parameter, which JSON_TABLE makes a table joined to
// the lock table by its primary key. Unlike PostgreSQL's, the UPDATE cannot
// itself say which leases it missed: MySQL has no RETURNING, and MariaDB
// 10.11 refuses UPDATE ... RETURNING (its RETURNING is on INSERT, REPLACE
// and DELETE; an INSERT ... ON DUPLICATE KEY UPDATE over the pairs would
// write a row for a key whose row is gone). So a short count costs the
// SELECT (check).
func (l *Locker) refreshJSON(leases batch, ttl time.Duration) (refreshing, error) {
	pairs := make([][2]string, leases.len())
	for j := range pairs {
		ls := leases.at(j)
		pairs[j] = [2]string{ls.key, ls.owner()}
	}
	doc, err := json.Marshal(pairs)
	if err != nil {
		return refreshing{}, err
	}
	join := l.table + " AS t JOIN JSON_TABLE(?, '$[*]' COLUMNS (name VARCHAR(255) PATH '$[0]', owner VARCHAR(255) PATH '$[1]')) AS j" +
		" ON t.name = j.name AND t.owner = j.owner"
	return refreshing{
		update:    "UPDATE " + join + " SET t.lock_until = " + l.d.now + " + ? WHERE t.lock_until > " + l.d.now,
		args:      []any{string(doc), ttl.Microseconds()},
		check:     "SELECT t.owner FROM " + join + " WHERE t.lock_until > " + l.d.now,
		checkArgs: []any{string(doc)},
	}, nil
}

// noJSONTable reports whether err is MySQL's or MariaDB's refusal of
// JSON_TABLE, which they have since 8.0.4 and 10.6: a syntax error, or an
// unknown function.
func noJSONTable(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "Error 1064") || strings.HasPrefix(msg, "Error 1305")
}

// refreshList is the batch refresh of SQLite (with RETURNING) and of MySQL
// without JSON_TABLE (with a SELECT after it): a list of (name, owner) rows.
func (l *Locker) refreshList(leases batch, ttl time.Duration) refreshing {
	var in strings.Builder
	args := make([]any, 0, 1+2*leases.len())
	args = append(args, ttl.Microseconds())
	if l.d.name != "mysql" {
		// SQLite reads a row-value list only as a VALUES table.
		in.WriteString("VALUES ")
	}
	for j := range leases.len() {
		if j > 0 {
			in.WriteString(", ")
		}
		in.WriteString("(?, ?)")
		ls := leases.at(j)
		args = append(args, ls.key, ls.owner())
	}
	where := " WHERE (name, owner) IN (" + in.String() + ") AND lock_until > " + l.d.now
	update := "UPDATE " + l.table + " SET lock_until = " + l.d.now + " + ?" + where
	if l.d.name == "mysql" {
		return refreshing{update: update, args: args, check: "SELECT owner FROM " + l.table + where, checkArgs: args[1:]}
	}
	return refreshing{update: update + " RETURNING owner", args: args}
}

// missedOwners reads the owner column of q's rows, the owners of the
// leases extended, and reports which of leases it does not name.
func missedOwners(q *gorm.DB, leases batch) ([]bool, error) {
	rows, err := q.Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := make(map[string]bool, leases.len())
	for rows.Next() {
		var owner string
		if err := rows.Scan(&owner); err != nil {
			return nil, err
		}
		held[owner] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(held) == leases.len() {
		return nil, nil
	}
	missed := make([]bool, leases.len())
	for j := range missed {
		missed[j] = !held[leases.at(j).owner()]
	}
	return missed, nil
}

// missedAt reads q's rows, the positions (from 1) of the leases of a chunk
// of n that were not extended; nil when there are none.
func missedAt(q *gorm.DB, n int) ([]bool, error) {
	rows, err := q.Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var missed []bool
	for rows.Next() {
		var at int64
		if err := rows.Scan(&at); err != nil {
			return nil, err
		}
		if at < 1 || at > int64(n) {
			return nil, fmt.Errorf("warden/sqllock: batch refresh named lease %d of %d", at, n)
		}
		if missed == nil {
			missed = make([]bool, n)
		}
		missed[at-1] = true
	}
	return missed, rows.Err()
}

package sqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
)

const (
	// DefaultTable is the lock table used unless WithTable says otherwise.
	DefaultTable = "warden_locks"
	// DefaultFenceTable is the table Fence records tokens in.
	DefaultFenceTable = "warden_fences"
	// maxName is the width of the name columns: guard's 200-byte keys plus
	// its prefix.
	maxName = 255
	// retries bounds how often a statement the database aborted having
	// run nothing (see retryable) is run again before the error is
	// reported. Each run is a new snapshot, which a contender's write may
	// overtake again: at SERIALIZABLE, with eight processes cycling one
	// lock, five runs were all refused once in 6,400 attempts.
	retries = 10
)

// Locker is a driver.Locker on a SQL table of leases, kept on the database's
// clock. It implements driver.BatchRefresher and is safe for concurrent
// use.
type Locker struct {
	db         *gorm.DB
	d          dialect
	table      string // quoted
	rawTable   string
	fenceTable string
	owner      string
	maxBackoff time.Duration
	// minPause is the first backoff pause; tests raise it to show that a
	// handoff came from a notification and not from polling.
	minPause time.Duration
	seq      atomic.Uint64
	q        queries
	// pool is the connections under db, which the statements of a lock's
	// life (acquire, refresh, release) use directly, skipping gorm's
	// statement building and callbacks, which cost as much client time as
	// the database/sql round trip itself. Their text is written for the
	// driver's placeholders (queries).
	pool gorm.ConnPool
	// noJSONTable is set once MySQL refused JSON_TABLE (before MySQL 8.0.4
	// and MariaDB 10.6): batch refreshes then list their leases.
	noJSONTable atomic.Bool
	// channel is the NOTIFY channel releases announce themselves on,
	// empty when they do not (not PostgreSQL, or WithoutNotify).
	channel string
	// notes wakes this Locker's waiters on those notifications; nil when
	// they only poll.
	notes *notifier
	// announcer defers the notification of releases while notes is hot.
	announcer announcer
	// bounded: every statement of the Locker returns once its ctx is
	// done (BoundedByContext).
	bounded bool
	// givingBack counts the give-backs running (see giveBack).
	givingBack atomic.Int32
	// inTransaction: db is bound to the caller's transaction.
	inTransaction bool
}

// queries are the lease-mode statements, built once per Locker because the
// table name is spliced in.
type queries struct {
	acquire string // upsert dialects: returns the new version when taken
	// acquireOrLeft is PostgreSQL's acquire for a waiter's later attempts:
	// it answers with the new version when taken, or else with the
	// holder's time left.
	acquireOrLeft string
	// acquireOrWait is acquireOrLeft for a waiter that listens: when the
	// lock is held it also marks the row as waited for (waiting_until),
	// so that its release notifies.
	acquireOrWait string
	// probe and mark are PostgreSQL's attempt of a waiter that listens
	// and was not woken by a notification (see poll): probe reads the
	// row's lease and mark in the statement's snapshot, with the
	// database's now; mark marks the row of a lease still held.
	probe    string
	mark     string
	readBack string // MySQL: the row's owner, version and time left
	refresh  string
	release  string
	// notifyRelease is PostgreSQL's release that also notifies the
	// channel, written into it, when the row was marked as waited for.
	notifyRelease string
	// giveBack frees the row of an attempt whose answer was lost, by its
	// owner alone (see giveBack), notifying as notifyRelease does where
	// releases notify.
	giveBack string
	// quietRelease is PostgreSQL's release that only reports whether the
	// row was marked as waited for, for a notification sent later.
	quietRelease string
	holds        string
	remaining    string
}

// New returns a Locker on db. It does not touch the database: call Migrate
// (or create the tables from the DDL in the package documentation) first.
// db's dialect must be postgres, mysql or sqlite.
//
// The statements that acquire, renew and release a lock go to db's
// connection pool (its ConnPool) directly, not through gorm: gorm's logger,
// callbacks and plugins see only the others (Migrate, batch renewals,
// inspection, Purge). A db bound to a transaction makes them run in it.
// New refuses a db on which gorm would send the others to another
// connection pool (see Replicas in the package documentation). Settings
// of db (its Logger, its plugins' callbacks) are read when New is called:
// a Logger set on db later does not reach the Locker's statements.
func New(db *gorm.DB, opts ...Option) (*Locker, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *gorm.DB", driver.ErrInvalidOption)
	}
	c := defaults()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	d, err := dialectOf(db)
	if err != nil {
		return nil, err
	}
	table, err := quoteTable(db, c.table)
	if err != nil {
		return nil, err
	}
	if c.owner == "" {
		if c.owner, err = defaultOwner(); err != nil {
			return nil, err
		}
	}
	l := &Locker{
		db:         db,
		d:          d,
		table:      table,
		rawTable:   c.table,
		fenceTable: DefaultFenceTable,
		owner:      c.owner,
		maxBackoff: c.maxBackoff,
		minPause:   4 * time.Millisecond,
	}
	l.announcer.delay, l.announcer.send = announceDelay, l.announce
	if d.name == "postgres" && c.notify {
		l.channel = channelName(c.table)
		// Releases notify whatever the driver, for the Lockers that can
		// listen; this one's waiters listen only with a Listener.
		if c.listener != nil {
			pool, err := db.DB()
			if err != nil {
				return nil, fmt.Errorf("%w: %w", driver.ErrInvalidOption, err)
			}
			l.notes = newNotifier(pool, c.table, c.listener)
		}
	}
	l.q = buildQueries(d, table, l.channel)
	if l.pool = db.Statement.ConnPool; l.pool == nil {
		return nil, fmt.Errorf("%w: the *gorm.DB has no connection pool", driver.ErrInvalidOption)
	}
	if err := onePool(db, table, c.table); err != nil {
		return nil, err
	}
	l.db = primary(db)
	l.bounded = boundedPool(l.pool)
	_, l.inTransaction = l.pool.(gorm.TxCommitter)
	return l, nil
}

var (
	_ driver.Locker         = (*Locker)(nil)
	_ driver.BatchRefresher = (*Locker)(nil)
	_ driver.ContextBounded = (*Locker)(nil)
)

// BoundedByContext implements driver.ContextBounded. It is true on a
// connection pool (a *sql.DB) of pgx's database/sql driver, whose every
// statement returns once its ctx is done: pgx then sets a past deadline on
// the connection, which ends any read or write at once (its default
// context handler; one configured to send a cancel request first ends by
// that handler's own delays), and database/sql gives up waiting for a
// connection, or dialling one, with the ctx too. guard then calls the
// Locker on the caller's goroutine instead of starting one of its own for
// every acquisition and release, which cost a lock cycle as much client
// time as either statement. Nothing is lost by not watching: a statement
// pgx abandons at its ctx's end is the same one that guard's goroutine
// would have seen abandoned. Other drivers, a transaction, or gorm's
// prepared-statement pool are watched by guard as before.
func (l *Locker) BoundedByContext() bool { return l.bounded }

// boundedPool reports whether pool is a *sql.DB of pgx v5's database/sql
// driver. The driver is recognised by its package path, so that the
// package links no driver.
func boundedPool(pool gorm.ConnPool) bool {
	db, ok := pool.(*sql.DB)
	if !ok {
		return false
	}
	t := reflect.TypeOf(db.Driver())
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath() == "github.com/jackc/pgx/v5/stdlib"
}

// defaultOwner is host:pid:random. The random part tells apart two
// processes on one host whose pids were reused (containers often all run as
// pid 1), and two Lockers in one process.
func defaultOwner() (string, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	if len(host) > 100 {
		host = host[:100]
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("warden/sqllock: owner id: %w", err)
	}
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:])), nil
}

// buildQueries builds the statements in the driver's own placeholders (see
// dialect.bind), since they bypass gorm. Releases notify channel, unless it
// is empty.
func buildQueries(d dialect, t, channel string) queries {
	q := buildGormQueries(d, t, channel)
	for _, s := range []*string{&q.acquire, &q.acquireOrLeft, &q.acquireOrWait, &q.probe, &q.mark, &q.readBack, &q.refresh, &q.release, &q.notifyRelease, &q.giveBack, &q.quietRelease, &q.holds, &q.remaining} {
		*s = d.bind(*s)
	}
	return q
}

func buildGormQueries(d dialect, t, channel string) queries {
	now := d.now
	// The rows a release may free: this owner's, unexpired.
	owned := " WHERE name = ? AND owner = ? AND lock_until > " + now
	q := queries{
		refresh: "UPDATE " + t + " SET lock_until = " + now + " + ? WHERE name = ? AND owner = ? AND version = ? AND lock_until > " + now,
		// Release keeps the row, and with it the version counter, so that
		// tokens keep growing: it only moves the expiry back to when this
		// owner took the lock, which is past. That needs no clock read,
		// unlike setting it to now: a read of the database's clock cost
		// the server 3,400 to 4,200 instructions on PostgreSQL (of some
		// 190,000 per lock cycle). A database clock that steps back then
		// leaves the lock free unless the step passes that instant, where
		// one to now kept it taken until the clock came back to the
		// release.
		release:   "UPDATE " + t + " SET lock_until = locked_at WHERE name = ? AND owner = ? AND version = ? AND lock_until > " + now,
		giveBack:  "UPDATE " + t + " SET lock_until = locked_at" + owned,
		holds:     "SELECT count(*) FROM " + t + " WHERE name = ? AND owner = ? AND version = ? AND lock_until > " + now,
		remaining: "SELECT lock_until - " + now + " FROM " + t + " WHERE name = ?",
		readBack:  "SELECT owner, version, lock_until - " + now + " FROM " + t + " WHERE name = ?",
	}
	if channel != "" {
		// A waiter that listens marks the row as waited for until a
		// moment past its next attempt (waiting_until), and a release
		// notifies only while the mark lasts: a NOTIFY, even one nobody
		// listens to, serialises the commits of every notifying
		// transaction of the server. The notification is part of the
		// releasing statement, hence of its transaction: PostgreSQL
		// delivers it only if the release commits, and only when the
		// row was this owner's to release. It calls pg_notify in SET,
		// whose expressions PostgreSQL evaluates only for a row that
		// passed WHERE, and CASE, which tries its conditions in turn,
		// only while the row is marked. The CASE is the value of
		// lock_until, locked_at whichever branch, and the channel is
		// written into the statement (it is made of the table's name,
		// letters, digits, underscores and a dot, or of hex digits):
		// waiting_until set to itself by the CASE, with the channel a
		// parameter, cost the server 1.6k instructions more per
		// uncontended lock cycle (189.4-190.0k against 188.0-188.3k;
		// callgrind of a private server's backend under pgbench's
		// prepared statements).
		// Marked means by a mark that outlasted the moment this owner
		// took the lock (locked_at), rather than one lasting until now:
		// that needs no clock read (see release). The two differ only
		// for a mark that ended during the hold, whose waiter marks
		// again if it still waits; otherwise the release sends one
		// notification that wakes no one.
		// The same call in RETURNING answered a row that nothing read,
		// which the server stores and sends and the driver reads: about
		// 2 µs more per release (of some 85) on loopback, for about the
		// same executor time. When a concurrent write to the row
		// (a waiter's mark) makes PostgreSQL check the row again, SET
		// is evaluated again and the transaction's like notifications
		// go as one; should the row no longer be this owner's by then
		// (its lease ran out and was taken over), a notification goes
		// out for a release that did not happen, which only wakes a
		// waiter into an attempt. (Without a CTE around the UPDATE: that
		// cost the server 5% more instructions per uncontended cycle.)
		notifying := "UPDATE " + t + " SET lock_until = CASE WHEN waiting_until <= locked_at THEN locked_at" +
			" WHEN pg_notify(" + quoteString(channel) + ", name) IS NULL THEN locked_at ELSE locked_at END"
		q.notifyRelease = notifying + " WHERE name = ? AND owner = ? AND version = ? AND lock_until > " + now
		q.giveBack = notifying + owned
		// RETURNING sees the new lock_until, locked_at: the condition
		// is notifyRelease's.
		q.quietRelease = q.release + " RETURNING waiting_until > lock_until"
	}
	// A new row's version is the database's now in microseconds, and a
	// takeover's the greater of that and the last version plus one, so that
	// tokens keep growing when Purge has deleted a free key's row and a later
	// acquisition inserts it again.
	insert := "INSERT INTO " + t + " AS t (name, owner, version, lock_until, locked_at) VALUES (?, ?, " + now + ", " + now + " + ?, " + now + ")"
	if d.name == "postgres" {
		// The clock read once, in a one-row VALUES list that PostgreSQL
		// keeps as a list (it does not pull up a volatile one) and
		// evaluates once: the three reads of a plain VALUES cost the
		// server 5% more instructions per acquisition. A subquery
		// (SELECT now) reads it once as well, but setting up its scan
		// and the Result under it cost the server 1.3-1.7k instructions
		// more per lock cycle (of some 210k) than the list's one scan.
		insert = "INSERT INTO " + t + " AS t (name, owner, version, lock_until, locked_at)" +
			" SELECT ?, ?, c.now, c.now + ?, c.now FROM (VALUES (" + now + ")) AS c (now)"
	}
	if d.upsert {
		// One statement: the row is inserted if absent, or taken over if
		// its lease has expired. Both databases lock the conflicting row
		// and evaluate the WHERE against its latest committed version, so
		// of two contenders for an expired lock exactly one sees it expired
		// and the other gets no row back.
		q.acquire = insert + " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, version = " + d.greatest + "(t.version + 1, excluded.version)," +
			" lock_until = excluded.lock_until, locked_at = excluded.locked_at" +
			" WHERE t.lock_until <= excluded.locked_at RETURNING version"
		if d.name == "postgres" {
			// A failed attempt also reads how long the holder has left,
			// which a waiter needs, in the same statement. The read sees
			// the statement's snapshot, which may be older than the row
			// the upsert found: at worst the waiter retries early.
			q.acquireOrLeft = "WITH a AS (" + q.acquire + ") SELECT version, NULL::bigint FROM a" +
				" UNION ALL SELECT NULL, lock_until - " + now + " FROM " + t +
				" WHERE name = ? AND NOT EXISTS (SELECT 1 FROM a)"
			q.acquireOrWait = acquireOrWait(t, insert, now)
			if channel != "" {
				q.probe = "SELECT lock_until, waiting_until, " + now + " FROM " + t + " WHERE name = ?"
				q.mark = "UPDATE " + t + " SET waiting_until = GREATEST(waiting_until, " + now + " + 2 * ?::bigint)" +
					" WHERE name = ? AND lock_until > " + now + " RETURNING lock_until - " + now
			}
		}
		return q
	}
	// MySQL: ON DUPLICATE KEY UPDATE cannot filter, so every column is set
	// to itself unless the lease had expired. The assignments run left to
	// right and see the columns already assigned, so lock_until, which the
	// condition reads, is assigned last. InnoDB holds the row's exclusive
	// lock while it evaluates them, so two contenders cannot both see the
	// lease expired. Whether this owner won is read back by owner id, which
	// is unique to the attempt.
	insert = "INSERT INTO " + t + " (name, owner, version, lock_until, locked_at) VALUES (?, ?, " + now + ", " + now + " + ?, " + now + ")"
	expired := "lock_until <= VALUES(locked_at)"
	q.acquire = insert + " ON DUPLICATE KEY UPDATE" +
		" owner = IF(" + expired + ", VALUES(owner), owner)," +
		" version = IF(" + expired + ", GREATEST(version + 1, VALUES(version)), version)," +
		" locked_at = IF(" + expired + ", VALUES(locked_at), locked_at)," +
		" lock_until = IF(" + expired + ", VALUES(lock_until), lock_until)"
	return q
}

// acquireOrWait is PostgreSQL's attempt of a waiter that listens. It takes
// the lock when the lease has expired, as acquire does; when not, it marks
// the row as waited for until twice the waiter's next pause (an argument,
// in microseconds) from now, unless an earlier mark already
// lasts that pause. Both happen under the row lock that ON CONFLICT takes,
// against the row's latest version: a release that commits after the mark
// sees it and notifies, one that committed before leaves the lease expired
// for this attempt to take. The mark is left as it is by a grant, and only
// ends with time, so that a holder that takes the lock back keeps the
// waiters' mark for its own release. It answers as acquireOrLeft does: the
// new version when taken (the row's owner is this attempt's), and the
// holder's time left; with no row written (the mark lasted), that is read
// from the statement's snapshot, or no row comes back when the snapshot
// holds none.
//
// It first reads the row in the statement's snapshot, without a lock: when
// the lease there is unexpired and its mark already lasts the pause, the
// attempt could neither take the lock nor write, and it skips the upsert,
// whose ON CONFLICT would lock the row before finding that out: under
// contention with no hold, waiters' attempts so queued on the row lock,
// with the holder's release and acquisition behind them (at 64 waiters,
// 2.5 such attempts per acquisition, each waiting 3 ms on the lock). What
// the snapshot shows was committed before the statement began, so a
// release committed later sees that mark and notifies, as it would have
// seen this attempt's; a release committed earlier is in the snapshot, and
// the upsert is not skipped. The decision to take the lock is still the
// upsert's, under the row lock.
func acquireOrWait(t, insert, now string) string {
	expired := "t.lock_until <= excluded.locked_at"
	when := func(taken, kept string) string {
		return "CASE WHEN " + expired + " THEN " + taken + " ELSE " + kept + " END"
	}
	skip := " WHERE NOT EXISTS (SELECT 1 FROM " + t + " AS s WHERE s.name = ? AND s.lock_until > c.now AND s.waiting_until >= c.now + ?::bigint)"
	return "WITH a AS (" + insert + skip + " ON CONFLICT (name) DO UPDATE SET" +
		" owner = " + when("excluded.owner", "t.owner") + "," +
		" version = " + when("GREATEST(t.version + 1, excluded.version)", "t.version") + "," +
		" lock_until = " + when("excluded.lock_until", "t.lock_until") + "," +
		" locked_at = " + when("excluded.locked_at", "t.locked_at") + "," +
		" waiting_until = " + when("t.waiting_until", "excluded.locked_at + 2 * ?::bigint") +
		" WHERE " + expired + " OR t.waiting_until < excluded.locked_at + ?::bigint" +
		" RETURNING CASE WHEN owner = ? THEN version END, lock_until - " + now + ")" +
		" SELECT * FROM a" +
		" UNION ALL SELECT NULL, lock_until - " + now + " FROM " + t +
		" WHERE name = ? AND NOT EXISTS (SELECT 1 FROM a)"
}

// Close sends the release notifications still deferred (see the package
// documentation), then stops the Locker's PostgreSQL listener, if one runs,
// and waits for it to end, returning its connection. The listener also stops
// by itself a few seconds after the last waiting Acquire ends, so Close is
// needed only to end it promptly, as at shutdown. Close does not release
// leases, and the Locker stays usable; its waiting Acquire calls then poll
// only. It always returns nil.
func (l *Locker) Close() error {
	l.announcer.flush()
	l.notes.close()
	return nil
}

// checkKey refuses a key the lock table cannot hold on every database: one
// PostgreSQL's text refuses (invalid UTF-8, a NUL byte) would otherwise be
// reported there as the database being unavailable, and is refused on the
// others too, so that a key names a lock the same way whichever it is.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", driver.ErrInvalidKey)
	case len(key) > maxName:
		return fmt.Errorf("%w: %d bytes, more than the %d the name column holds", driver.ErrInvalidKey, len(key), maxName)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: invalid UTF-8", driver.ErrInvalidKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: %q holds a NUL byte", driver.ErrInvalidKey, key)
	}
	return nil
}

// checkOwner refuses an owner label the owner column cannot hold as it
// is. Other characters (a terminal's controls included) are the label's
// own, as on every other backend: tools that show them escape them.
func checkOwner(owner string) error {
	switch {
	case len(owner) > driver.MaxOwnerLen:
		return fmt.Errorf("%w: owner label of %d bytes, more than %d", driver.ErrInvalidOption, len(owner), driver.MaxOwnerLen)
	case !utf8.ValidString(owner):
		return fmt.Errorf("%w: owner label %q is not UTF-8", driver.ErrInvalidOption, owner)
	case strings.IndexByte(owner, 0) >= 0:
		return fmt.Errorf("%w: owner label %q holds a NUL byte", driver.ErrInvalidOption, owner)
	}
	return nil
}

// checkTTL refuses a lease's TTL shorter than the microsecond the
// statements count in, which would end the lease as it is granted or
// refreshed.
func checkTTL(ttl time.Duration) error {
	if ttl < time.Microsecond {
		return fmt.Errorf("%w: TTL %v, want at least 1µs", driver.ErrInvalidOption, ttl)
	}
	return nil
}

// Acquire implements driver.Locker. Waiting polls with jittered exponential
// backoff, never sleeping past the holder's expiry; on PostgreSQL a release
// notification also ends the pause early (see the package documentation).
// It goes on through database errors until ctx is done, but for those no
// retry mends, which it returns at once wrapping driver.ErrInvalidOption: a
// lock table missing or lacking a column, and a connection pooler that
// loses prepared statements (see the package documentation). A Locker
// bound to the caller's transaction returns any database error at once. It
// cannot be fair, so opts.Fair is refused with driver.ErrUnsupported.
func (l *Locker) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (lease driver.Lease, err error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	// The label is kept in the owner column, where PostgreSQL and MySQL
	// refuse invalid text, and the TTL is added to the database's now: a
	// caller of the Locker itself gets an error, not an outage or a lease
	// already expired.
	if err := errors.Join(checkTTL(opts.TTL), checkOwner(opts.Owner)); err != nil {
		return nil, err
	}
	if opts.Fair {
		return nil, fmt.Errorf("%w: fair waiting", driver.ErrUnsupported)
	}
	var (
		w       *waiter
		waiting bool // an attempt failed, and the waiter joined
	)
	defer func() { w.leave(lease == nil) }()
	backoff := driver.Backoff{Min: l.minPause, Max: l.maxBackoff}
	// poll: the waiter listens and was not woken by a notification, so
	// the lock is most likely still held (see poll).
	poll := false
	for {
		// A waiter's later attempts read the holder's time left as they
		// go, where the database can, and a waiter that listens marks
		// the row as waited for until past its next pause, so that the
		// release notifies; its first attempt is as short as an
		// uncontended one.
		var pause time.Duration
		if w != nil {
			pause = backoff.Next()
		}
		mark := l.announcer.begin(key)
		got, left, err := l.try(ctx, key, opts.TTL, opts.Owner, waiting, pause, poll)
		// Whoever holds the lock now, this Locker or another, will
		// announce its own release.
		l.announcer.end(key, mark, err == nil)
		if got != nil {
			return got, nil
		}
		if !opts.Wait {
			if err != nil {
				return nil, err
			}
			return nil, driver.ErrNotAcquired
		}
		// Bound to the caller's transaction, any error ends the wait: the
		// database aborted the transaction (PostgreSQL refuses every
		// statement after an error, 25P02), which no later attempt in it
		// mends, and the caller, who retries its transactions, is given
		// the error itself.
		if err != nil && (l.inTransaction || !errors.Is(err, driver.ErrUnavailable)) {
			return nil, err
		}
		if !waiting {
			// Joined before the row is read again, so that a release
			// committed after that read is announced to this waiter:
			// the attempt read it before the waiter could hear. One
			// that listens tries again at once, marking the row.
			w, waiting = l.notes.join(key), true
			if w != nil && err == nil {
				poll = true
				continue
			}
			left = unknown
		}
		if pause == 0 {
			// Not set before the attempt, which did not mark.
			pause = backoff.Next()
		}
		if err == nil {
			if left == unknown {
				left, err = l.remaining(ctx, key)
			}
			// The holder's lease cannot end before its recorded expiry,
			// so there is no point waking up after it either: retry as
			// it ends (or at once when it already has).
			if err == nil && left < pause {
				pause = max(left, 0) + time.Millisecond
			}
		}
		woken, err := sleep(ctx, pause, w.wake())
		if err != nil {
			return nil, err
		}
		poll = !woken
	}
}

// sleep is driver.Sleep that also reports whether a wake-up, rather than
// the pause's end, ended it.
func sleep(ctx context.Context, pause time.Duration, wake <-chan struct{}) (woken bool, err error) {
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-t.C:
		return false, nil
	case <-wake:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// unknown stands for a holder's time left that an attempt did not read.
const unknown time.Duration = math.MinInt64

// try makes one lease-mode attempt. It returns a nil lease and no error when
// the lock is held by someone else, and then how long the holder's lease had
// left (zero or less when none) when the attempt read it, or unknown. A
// waiter's attempt reads that where it can (readLeft); with pause, one of a
// waiter that listens also marks the row as waited for at least that long
// (PostgreSQL), and with poll it reads the row first (see poll).
func (l *Locker) try(ctx context.Context, key string, ttl time.Duration, label string, readLeft bool, pause time.Duration, poll bool) (*lease, time.Duration, error) {
	seq := l.seq.Add(1)
	owner := l.ownerOf(seq, label)
	sent := time.Now()
	var (
		a   attempt
		err error
	)
	for attempt := range retries {
		a, err = l.tryOnce(ctx, key, owner, ttl, readLeft, pause, poll)
		if err == nil || !retryable(ctx, l.pool, err, attempt) {
			break
		}
	}
	if notFit := l.notFit(err); notFit != nil {
		return nil, unknown, notFit
	}
	if err != nil {
		if unanswered(err) && !errors.As(err, new(takesNothing)) {
			l.giveBackLater(ctx, key, owner)
		}
		return nil, unknown, unavailable(ctx, err)
	}
	if !a.taken {
		return nil, a.left, nil
	}
	return newLease(l, key, seq, label, a.version, ttl, sent), 0, nil
}

// attempt is what one acquiring statement found.
type attempt struct {
	taken   bool
	version int64         // when taken
	left    time.Duration // when not taken: the holder's time left, or unknown
}

func (l *Locker) tryOnce(ctx context.Context, key, owner string, ttl time.Duration, readLeft bool, pause time.Duration, poll bool) (attempt, error) {
	db := l.pool
	// Each declared where it is read: the pointers given to the scan
	// move a variable to the heap, wherever the scan comes, and an
	// uncontended attempt reads the version alone.
	var version sql.NullInt64
	switch {
	case readLeft && l.q.acquireOrLeft != "":
		var left sql.NullInt64
		query, args := l.q.acquireOrLeft, []any{key, owner, ttl.Microseconds(), key}
		if pause > 0 {
			p := pause.Microseconds()
			if poll && l.q.probe != "" {
				a, done, err := l.poll(ctx, key, p)
				if err != nil {
					return a, takesNothing{err}
				}
				if done {
					return a, nil
				}
			}
			query, args = l.q.acquireOrWait, []any{key, owner, ttl.Microseconds(), key, p, p, p, owner, key}
		}
		err := l.queryRow(ctx, query, args, &version, &left)
		if errors.Is(err, sql.ErrNoRows) {
			// The row was inserted after the statement's snapshot (and
			// an earlier mark lasted).
			return attempt{left: unknown}, nil
		}
		if err != nil {
			return attempt{}, err
		}
		if version.Valid {
			return attempt{taken: true, version: version.Int64}, nil
		}
		return attempt{left: micros(left.Int64)}, nil
	case l.d.upsert:
		err := l.queryRow(ctx, l.q.acquire, []any{key, owner, ttl.Microseconds()}, &version)
		if errors.Is(err, sql.ErrNoRows) {
			return attempt{left: unknown}, nil
		}
		return attempt{taken: err == nil, version: version.Int64}, err
	}
	if _, err := db.ExecContext(ctx, l.q.acquire, key, owner, ttl.Microseconds()); err != nil {
		return attempt{}, err
	}
	var left sql.NullInt64
	// The owner id is unique to this attempt, so finding it in the row
	// means this attempt took the lock. Reading in a separate statement is
	// safe: the row can change owner again only after our lease expires.
	var holder string
	err := db.QueryRowContext(ctx, l.q.readBack, key).Scan(&holder, &version, &left)
	if errors.Is(err, sql.ErrNoRows) {
		return attempt{left: unknown}, nil
	}
	if err != nil {
		return attempt{}, err
	}
	if holder == owner {
		return attempt{taken: true, version: version.Int64}, nil
	}
	return attempt{left: micros(left.Int64)}, nil
}

// poll is the attempt of a waiter that listens when no notification woke
// it, on PostgreSQL: the lock is then most likely held still, and the
// attempt only has to learn the holder's time left and make sure the row is
// marked as waited for at least pause (µs). acquireOrWait does both and
// takes the lock when the lease has ended, in one statement that cost the
// server 167-207k instructions (PostgreSQL 15, callgrind), a plain read of
// the row 50k: its plan is cached, but its executor is set up at every run,
// and setting up the upsert's projections, its CASEs, the read that
// precedes it and the one that follows it is some 84k of that. poll reads
// the row in the statement's snapshot first, and is done when the lease
// there is unexpired and its mark lasts the pause (acquireOrWait's own
// skip, with the same reasoning: the mark was committed before the read
// began, so a later release sees it). When the mark is shorter, it marks
// the row by an UPDATE of a lease still held, under the row lock that
// orders it with the release, as acquireOrWait does: a release committed
// after it sees the mark and notifies, and one committed before leaves it
// no row to mark. It reports not done when the snapshot shows no row or an
// ended lease, or the mark found the lease ended: acquireOrWait then makes
// the attempt, and only it ever takes the lock.
func (l *Locker) poll(ctx context.Context, key string, pause int64) (a attempt, done bool, err error) {
	var until, marked, now sql.NullInt64
	err = l.queryRow(ctx, l.q.probe, []any{key}, &until, &marked, &now)
	if errors.Is(err, sql.ErrNoRows) || err == nil && until.Int64 <= now.Int64 {
		return attempt{}, false, nil
	}
	if err != nil {
		return attempt{}, false, err
	}
	if marked.Int64 >= now.Int64+pause {
		return attempt{left: micros(until.Int64 - now.Int64)}, true, nil
	}
	var left sql.NullInt64
	err = l.queryRow(ctx, l.q.mark, []any{pause, key}, &left)
	if errors.Is(err, sql.ErrNoRows) {
		return attempt{}, false, nil
	}
	if err != nil {
		return attempt{}, false, err
	}
	return attempt{left: micros(left.Int64)}, true, nil
}

// takesNothing is the error of a statement that cannot take the lock
// (poll's): whether it ran or not, there is nothing to give back.
type takesNothing struct{ error }

func (e takesNothing) Unwrap() error { return e.error }

func micros(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// ownerOf is the owner value of the acquisition numbered seq and labelled
// label: the Locker's id and the number, so that a new lease never mistakes
// an older lease of the same Locker (expired, released) for itself, then the
// label (see labelled). It is written into one allocation, as every
// acquisition and release pays for it.
func (l *Locker) ownerOf(seq uint64, label string) string {
	var num [20]byte
	digits := strconv.AppendUint(num[:0], seq, 10)
	n := len(l.owner) + 1 + len(digits)
	if l.hashesOwner(seq, label) {
		return labelled(l.owner+"/"+string(digits), label)
	}
	var b strings.Builder
	b.Grow(n + len(labelSep) + len(label))
	b.WriteString(l.owner)
	b.WriteByte('/')
	b.Write(digits)
	b.WriteString(labelSep)
	b.WriteString(label)
	return b.String()
}

// hashesOwner reports whether the owner value of the acquisition numbered
// seq and labelled label is too long for the column unless its id is hashed
// (see labelled).
func (l *Locker) hashesOwner(seq uint64, label string) bool {
	return len(l.owner)+1+digits(seq)+len(labelSep)+len(label) > ownerWidth
}

// digits is the length of n in decimal.
func digits(n uint64) int {
	d := 1
	for ; n >= 10; n /= 10 {
		d++
	}
	return d
}

// remaining is how long the current holder's lease has left by the
// database's clock (zero or less when none).
func (l *Locker) remaining(ctx context.Context, key string) (time.Duration, error) {
	var n sql.NullInt64
	err := l.queryRow(ctx, l.q.remaining, []any{key}, &n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable(ctx, err)
	}
	return micros(n.Int64), nil
}

package sqllock

import (
	"context"
	"errors"
	"strings"
	"time"
)

// An acquiring statement whose answer never came (its ctx ended, or its
// connection broke, after it was sent) may still run on the server: the
// driver abandons the connection, not the statement, which PostgreSQL and
// MySQL go on running, queued on the row's lock or merely not scheduled yet,
// and commit (pgx follows it with a cancel request, which may reach the
// server after the commit; go-sql-driver sends none). When it finds the lease expired, it takes the lock for an
// attempt that nobody holds a lease of, and the lock stays taken until its
// TTL runs out: the next caller waits that long, and a user who cancelled a
// waiting Acquire (a request that timed out, a shutdown) has left the lock
// held by no one. The attempt's owner value is its own (ownerOf numbers each
// attempt), so such an attempt is followed, off the caller's path, by
// releases of the row by that owner alone (giveBack), which cannot free
// anyone else's lock. They are the release's UPDATE of lock_until without its
// version, which no other attempt shares: the row's version is left as the
// attempt made it, so the next holder's token is still past it, and no
// release of an earlier holder (another owner value) matches the row.

// giveBackTimeout bounds each statement of a give-back, so that one lasts
// seconds against a database that does not answer.
const giveBackTimeout = time.Second

// maxGivingBack bounds the give-backs a Locker runs at once: in an outage
// every attempt of a waiting Acquire fails, and each would start one. An
// attempt with no give-back left to spare leaves its row, if it took it, to
// its TTL, as before give-backs.
const maxGivingBack = 64

// giveBackLater starts the give-back of the attempt of owner on key, unless
// maxGivingBack are running.
func (l *Locker) giveBackLater(ctx context.Context, key, owner string) {
	if l.givingBack.Add(1) > maxGivingBack {
		l.givingBack.Add(-1)
		return
	}
	go l.giveBack(context.WithoutCancel(ctx), key, owner)
}

// giveBack frees key's row while owner holds it, trying a few times, and
// stops once it has. The first try, sent at once, queues on the row's lock
// behind the attempt when the attempt holds it or waits for it (both
// databases grant a row's lock in turn), and so frees the row as soon as
// the attempt has taken it; the later ones cover an attempt that had not
// reached the row yet, a statement still in flight to a loaded server, the
// first of them soon, as such an attempt is late by a scheduling delay of
// the server's.
func (l *Locker) giveBack(ctx context.Context, key, owner string) {
	defer l.givingBack.Add(-1)
	for _, pause := range [...]time.Duration{0, 25 * time.Millisecond, 75 * time.Millisecond, 400 * time.Millisecond, 2 * time.Second} {
		time.Sleep(pause)
		gctx, cancel := context.WithTimeout(ctx, giveBackTimeout)
		res, err := l.pool.ExecContext(gctx, l.q.giveBack, key, owner)
		cancel()
		if err != nil {
			continue
		}
		if n, err := res.RowsAffected(); err == nil && n > 0 {
			return
		}
	}
}

// unanswered reports whether err, an acquiring statement's, may have left
// the statement running or run on the server: every error but the
// database's own answer (its error), which says that the statement failed
// and its changes are gone. That is PostgreSQL's error, with its SQLState
// (pgx's *pgconn.PgError and lib/pq's *pq.Error), MySQL's, "Error " and
// its number (go-sql-driver's *mysql.MySQLError), or SQLite's, with its
// result code (glebarez/go-sqlite's and modernc.org/sqlite's *Error: a
// busy database, an interrupted statement, rolled back), told apart
// without linking any driver. SQLite's statements run in the calling
// process and are over when the call returns, but database/sql may report
// the ctx's end for one that had committed (it closes the rows of a
// RETURNING statement whose step had written them); that needs the first
// give-back only.
func unanswered(err error) bool {
	var (
		stated interface{ SQLState() string }
		coded  interface{ Code() int }
	)
	if errors.As(err, &stated) || errors.As(err, &coded) {
		return false
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if rest, ok := strings.CutPrefix(e.Error(), "Error "); ok && rest != "" && rest[0] >= '0' && rest[0] <= '9' {
			return false
		}
	}
	return true
}

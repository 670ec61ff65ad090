package sqllock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/warden-go/warden/guard"
)

// sessionLease is one session-mode holding: a session lock held by a
// connection taken out of the pool for as long as the lease lives.
type sessionLease struct {
	l       *Locker
	key     string
	version int64
	name    any // the session lock's name: int64 on PostgreSQL, string on MySQL

	mu       sync.Mutex
	conn     *sql.Conn
	released bool
	once     sync.Once
	done     chan struct{}
}

// sessionName maps a key to the database's session lock name. PostgreSQL
// advisory locks take a 64-bit integer; MySQL lock names are at most 64
// characters and shared by every database on the server. A hash collision
// only makes two keys exclude each other, never lets two holders in.
func (l *Locker) sessionName(key string) any {
	if l.d.name == "postgres" {
		h := fnv.New64a()
		h.Write([]byte(l.rawTable))
		h.Write([]byte{0})
		h.Write([]byte(key))
		return int64(h.Sum64())
	}
	sum := sha256.Sum256([]byte(l.rawTable + "\x00" + key))
	return "warden:" + hex.EncodeToString(sum[:])[:56]
}

func (l *Locker) sessionSQL() (try, check, unlock string) {
	if l.d.name == "postgres" {
		return "SELECT pg_try_advisory_lock($1)",
			"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()" +
				" AND granted AND objsubid = 1 AND classid::bigint = $1 AND objid::bigint = $2)",
			l.pgUnlock()
	}
	return "SELECT COALESCE(GET_LOCK(?, 0), 0) = 1",
		"SELECT COALESCE(IS_USED_LOCK(?) = CONNECTION_ID(), 0) = 1",
		"SELECT COALESCE(RELEASE_LOCK(?), 0) = 1"
}

// pgUnlock is PostgreSQL's unlock, notifying the table's channel when the
// lock was held: in the one statement, so that the notification is sent
// only for a release that happened. The CASE evaluates the notifying
// subquery only in its THEN branch.
func (l *Locker) pgUnlock() string {
	if l.channel == "" {
		return "SELECT pg_advisory_unlock($1)"
	}
	return "SELECT CASE WHEN pg_advisory_unlock($1) THEN (SELECT true FROM pg_notify($2, $3)) ELSE false END"
}

// trySession makes one session-mode attempt: a non-blocking session lock on
// a dedicated connection, then a version bump in the lock table for the
// fencing token (done while the session lock is held, so bumps are
// serialised by it).
func (l *Locker) trySession(ctx context.Context, key string) (guard.Lease, error) {
	pool, err := l.db.DB()
	if err != nil {
		return nil, dbErr(ctx, err)
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return nil, dbErr(ctx, fmt.Errorf("acquire %q: %w", key, err))
	}
	name := l.sessionName(key)
	try, _, _ := l.sessionSQL()
	var ok bool
	if err := conn.QueryRowContext(ctx, try, name).Scan(&ok); err != nil {
		// The lock may have been granted before the failure was seen:
		// only closing the session is sure to give it back.
		discard(conn)
		return nil, dbErr(ctx, fmt.Errorf("acquire %q: %w", key, err))
	}
	if !ok {
		conn.Close()
		return nil, nil
	}
	owner := l.leaseOwner()
	version, err := l.bump(ctx, key, owner)
	if err != nil {
		discard(conn)
		return nil, dbErr(ctx, fmt.Errorf("acquire %q: token: %w", key, err))
	}
	return &sessionLease{l: l, key: key, version: version, name: name, conn: conn, done: make(chan struct{})}, nil
}

// bump increments the key's version unconditionally and returns it.
func (l *Locker) bump(ctx context.Context, key, owner string) (int64, error) {
	var err error
	for range retries {
		db := l.db.WithContext(ctx)
		var version int64
		if l.d.upsert {
			err = db.Raw(l.q.bump, key, owner, 0).Row().Scan(&version)
		} else if err = db.Exec(l.q.bump, key, owner, 0).Error; err == nil {
			err = db.Raw(l.q.readBack, key, owner).Row().Scan(&version)
		}
		if err == nil {
			return version, nil
		}
		if !retryable(err) {
			break
		}
	}
	return 0, err
}

// discard closes conn and keeps the pool from reusing it, which ends the
// database session and with it any session lock it holds.
func discard(conn *sql.Conn) {
	conn.Raw(func(any) error { return driver.ErrBadConn })
	conn.Close()
}

// Key implements guard.Lease.
func (s *sessionLease) Key() string { return s.key }

// Token implements guard.Lease: the lock row's version, bumped by each
// session-mode acquisition.
func (s *sessionLease) Token() uint64 { return uint64(s.version) }

// Done implements guard.Lease. It is closed when Refresh finds the session
// or its lock gone.
func (s *sessionLease) Done() <-chan struct{} { return s.done }

func (s *sessionLease) lost() error {
	s.once.Do(func() { close(s.done) })
	return fmt.Errorf("%w: %q: session lock gone", guard.ErrNotHeld, s.key)
}

// Refresh implements guard.Lease. A session lock has no TTL; Refresh checks
// on the holding connection that the database still counts the lock as this
// session's.
func (s *sessionLease) Refresh(ctx context.Context, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return fmt.Errorf("%w: %q: released", guard.ErrNotHeld, s.key)
	}
	_, check, _ := s.l.sessionSQL()
	args := []any{s.name}
	if n, ok := s.name.(int64); ok {
		// pg_locks shows a bigint advisory key as its two 32-bit halves.
		args = []any{int64(uint64(n) >> 32), int64(uint64(n) & 0xffffffff)}
	}
	var held bool
	err := s.conn.QueryRowContext(ctx, check, args...).Scan(&held)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil || !held {
		// A session that failed a query cannot be trusted to hold
		// anything: close it, which frees the lock on the server if the
		// server still thought otherwise.
		s.released = true
		discard(s.conn)
		return s.lost()
	}
	return nil
}

// Release implements guard.Lease: it unlocks on the holding connection and
// hands the connection back to the pool. On PostgreSQL the unlocking
// statement also notifies the table's channel.
func (s *sessionLease) Release(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return nil
	}
	_, _, unlock := s.l.sessionSQL()
	args := []any{s.name}
	if s.l.channel != "" {
		args = append(args, s.l.channel, s.key)
	}
	var ok bool
	err := s.conn.QueryRowContext(ctx, unlock, args...).Scan(&ok)
	s.released = true
	if err != nil || !ok {
		// Closing the session frees whatever it still held; but a session
		// that fails may have died earlier, letting another holder in.
		discard(s.conn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %q: session lock gone", guard.ErrNotHeld, s.key)
	}
	s.conn.Close()
	return nil
}

package sqllock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/warden-go/warden/guard"
)

// lease is one lease-mode holding: the lock row as this owner wrote it.
type lease struct {
	l       *Locker
	key     string
	owner   string
	version int64

	mu       sync.Mutex // serialises Refresh and Release
	released bool
	// timer closes done at the local deadline: the application-clock
	// instant the last successful statement was sent, plus its TTL. The
	// database stamped the lease later than that on its own clock, so the
	// lease is certainly over by then if no refresh got through.
	timer *time.Timer
	once  sync.Once
	done  chan struct{}
}

func newLease(l *Locker, key, owner string, version int64, ttl time.Duration, sent time.Time) *lease {
	ls := &lease{l: l, key: key, owner: owner, version: version, done: make(chan struct{})}
	ls.timer = time.AfterFunc(sent.Add(ttl).Sub(l.clock()), ls.expire)
	return ls
}

func (ls *lease) expire() { ls.once.Do(func() { close(ls.done) }) }

// Key implements guard.Lease.
func (ls *lease) Key() string { return ls.key }

// Token implements guard.Lease: the row's version, which only grows since
// the row is never deleted.
func (ls *lease) Token() uint64 { return uint64(ls.version) }

// Done implements guard.Lease. It is closed when a refresh finds the lease
// lost, or when a whole TTL passed on the application's clock since the last
// statement that extended the lease was sent.
func (ls *lease) Done() <-chan struct{} { return ls.done }

func (ls *lease) notHeld() error {
	return fmt.Errorf("%w: %q", guard.ErrNotHeld, ls.key)
}

// Refresh implements guard.Lease. The row is extended only while it is still
// this owner's and unexpired by the database's clock.
func (ls *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: TTL %v", guard.ErrInvalidOption, ttl)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.released {
		return ls.notHeld()
	}
	select {
	case <-ls.done:
		return ls.notHeld()
	default:
	}
	l := ls.l
	sent := l.clock()
	held, err := ls.exec(ctx, l.q.refresh, ttl.Microseconds(), ls.key, ls.owner, ls.version)
	if err == nil && !held && l.d.name == "mysql" {
		// MySQL counts changed rows, not matched ones: a refresh that
		// wrote the very same lock_until reports zero. Ask again.
		held, err = ls.stillHeld(ctx)
	}
	if err != nil {
		return dbErr(ctx, fmt.Errorf("refresh %q: %w", ls.key, err))
	}
	if !held {
		ls.expire()
		return ls.notHeld()
	}
	// A timer that already fired has told the holder the lease is gone;
	// the refresh came too late to take that back.
	if !ls.timer.Stop() {
		return ls.notHeld()
	}
	ls.timer.Reset(sent.Add(ttl).Sub(l.clock()))
	return nil
}

// Release implements guard.Lease. It moves the row's expiry to now and keeps
// the row, so the version goes on growing. On PostgreSQL the same statement
// notifies the table's channel, waking a waiter at once.
func (ls *lease) Release(ctx context.Context) error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.released {
		return nil
	}
	args := []any{ls.key, ls.owner, ls.version}
	if ls.l.channel != "" {
		args = append(args, ls.l.channel)
	}
	held, err := ls.exec(ctx, ls.l.q.release, args...)
	if err != nil {
		return dbErr(ctx, fmt.Errorf("release %q: %w", ls.key, err))
	}
	ls.released = true
	ls.timer.Stop()
	if !held {
		return ls.notHeld()
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

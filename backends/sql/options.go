package sqllock

import (
	"fmt"
	"time"

	"github.com/warden-go/warden/guard"
)

// Option configures a Locker.
type Option func(*config) error

type config struct {
	table      string
	session    bool
	owner      string
	clock      func() time.Time
	maxBackoff time.Duration
	notify     bool
}

func defaults() config {
	return config{
		table:      DefaultTable,
		clock:      time.Now,
		maxBackoff: 250 * time.Millisecond,
		notify:     true,
	}
}

// WithTable sets the lock table (default DefaultTable). A schema-qualified
// name (schema.table) is accepted. Lockers that must exclude each other have
// to use the same table.
func WithTable(name string) Option {
	return func(c *config) error {
		c.table = name
		return nil
	}
}

// WithSessionLocks switches the Locker to session mode: each lock is a
// database session lock (pg_advisory_lock on PostgreSQL, GET_LOCK on MySQL
// and MariaDB) held on a connection of its own, so the database frees it the
// moment the holding process dies, with no TTL to wait out.
//
// The cost is one pooled connection per held lock, kept out of the pool
// until Release: size the pool (SetMaxOpenConns) for the number of locks
// held at once plus the application's own queries. The TTL passed to Acquire
// and Refresh is ignored; Refresh checks that the connection is alive.
// SQLite has no session locks: New returns an error wrapping
// guard.ErrUnsupported.
//
// Lease-mode and session-mode lockers must not share a table: they do not
// exclude each other.
func WithSessionLocks() Option {
	return func(c *config) error {
		c.session = true
		return nil
	}
}

// WithOwner sets the owner id recorded with each lock this Locker takes, in
// place of the default host:pid:random. It must be unique to this Locker
// among every process sharing the table: two lockers with one owner id would
// be told apart only by the per-lease counter appended to it.
func WithOwner(id string) Option {
	return func(c *config) error {
		if id == "" || len(id) > 200 {
			return fmt.Errorf("%w: owner id must be 1 to 200 bytes", guard.ErrInvalidOption)
		}
		c.owner = id
		return nil
	}
}

// WithClock sets the application clock (default time.Now). The Locker reads
// it only to measure its own elapsed time, for the local deadline that closes
// a lease-mode Lease.Done when no refresh succeeded for a whole TTL. Whether a
// lock is free, when a lease ends and who may take it over are decided by the
// database's clock alone, so application clocks that disagree by minutes do
// not break exclusion.
func WithClock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return fmt.Errorf("%w: nil clock", guard.ErrInvalidOption)
		}
		c.clock = now
		return nil
	}
}

// WithMaxBackoff bounds the pause between two attempts of a waiting Acquire
// (default 250ms). Pauses start at a few milliseconds, double, carry jitter,
// and never reach past the holder's recorded expiry. On PostgreSQL a release
// notification usually ends the pause sooner; the bound is what a waiter
// waits when a notification is lost.
func WithMaxBackoff(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: max backoff %v below 1ms", guard.ErrInvalidOption, d)
		}
		c.maxBackoff = d
		return nil
	}
}

// WithoutNotify turns off PostgreSQL's LISTEN/NOTIFY handoff: releases send
// no notification and waiting Acquire calls only poll, with backoff up to
// WithMaxBackoff, and take no pooled connection for a listener. PostgreSQL
// serialises the commits of all notifying transactions on the server (a
// global lock on its notification queue), which can matter where releases
// are very frequent and waits are rare. Lockers with and without it can share a table: a waiter
// that hears nothing still polls. It has no effect on MySQL and SQLite,
// which always poll.
func WithoutNotify() Option {
	return func(c *config) error {
		c.notify = false
		return nil
	}
}

package sqllock

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warden-go/warden/guard/driver"
)

// Option configures a Locker.
type Option func(*config) error

type config struct {
	table      string
	owner      string
	maxBackoff time.Duration
	notify     bool
	listener   Listener
}

func defaults() config {
	return config{
		table:      DefaultTable,
		maxBackoff: 250 * time.Millisecond,
		notify:     true,
	}
}

// WithTable sets the lock table (default DefaultTable). A schema-qualified
// name (schema.table) is accepted. Lockers that must exclude each other have
// to use the same table.
func WithTable(name string) Option {
	return func(c *config) error {
		if name == "" {
			return fmt.Errorf("%w: table name %q is empty", driver.ErrInvalidOption, name)
		}
		c.table = name
		return nil
	}
}

// WithOwner sets the owner id recorded with each lock this Locker takes, in
// place of the default host:pid:random. It must be unique to this Locker
// among every process sharing the table: two lockers with one owner id would
// be told apart only by the per-lease counter appended to it. It must be 1
// to 200 bytes of UTF-8 without NUL, which the owner column could not hold.
func WithOwner(id string) Option {
	return func(c *config) error {
		switch {
		case id == "" || len(id) > 200:
			return fmt.Errorf("%w: owner id %q must be 1 to 200 bytes", driver.ErrInvalidOption, id)
		case !utf8.ValidString(id) || strings.ContainsRune(id, 0):
			return fmt.Errorf("%w: owner id %q must be UTF-8 without NUL", driver.ErrInvalidOption, id)
		}
		c.owner = id
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
			return fmt.Errorf("%w: max backoff %v below 1ms", driver.ErrInvalidOption, d)
		}
		c.maxBackoff = d
		return nil
	}
}

// WithoutNotify turns off PostgreSQL's LISTEN/NOTIFY handoff: this Locker's
// releases send no notification, even of a lock a waiter marked, and its
// waiting Acquire calls only poll, with backoff up to WithMaxBackoff,
// neither marking the rows they wait for nor taking a pooled connection for
// a listener. Releases that no waiter marked notify in no case, so what it
// still saves is the notification of a contended lock's release:
// PostgreSQL serialises the commits of all notifying transactions on the
// server (a global lock on its notification queue), which can matter where
// contended locks change hands very often and waiters can afford their
// poll's delay. Its statements do not use the waiting_until column, so it
// also runs on a lock table of an earlier version that Migrate has not yet
// seen. Lockers with and without it can share a table: a waiter that hears
// nothing still polls. It has no effect on MySQL and SQLite, which always
// poll.
func WithoutNotify() Option {
	return func(c *config) error {
		c.notify = false
		return nil
	}
}

// WithListener lets the Locker's waiting Acquire calls on PostgreSQL hear
// releases at once instead of at their next poll: pass pglisten.Listener{}
// with gorm.io/driver/postgres. Without one, releases still notify (for the
// Lockers that listen) and this Locker's waiters poll. It has no effect on
// MySQL and SQLite, or with WithoutNotify.
func WithListener(l Listener) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil Listener", driver.ErrInvalidOption)
		}
		c.listener = l
		return nil
	}
}

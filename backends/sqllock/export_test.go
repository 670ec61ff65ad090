package sqllock

import (
	"context"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// SetMinPause sets the first backoff pause. Raised to the maximum backoff, it
// makes every pause long, so that a test can tell a handoff by notification
// from one by polling.
func SetMinPause(l *Locker, d time.Duration) { l.minPause = d }

// Channel is the NOTIFY channel of l's table ("" when l does not notify).
func Channel(l *Locker) string { return l.channel }

// ListenStats reports how often l's listener started listening, how often
// its connection failed, and how many waiters a notification woke.
func ListenStats(l *Locker) (listens, drops, woken uint64) {
	if l.notes == nil {
		return 0, 0, 0
	}
	return l.notes.listens.Load(), l.notes.drops.Load(), l.notes.woken.Load()
}

// Waiters is the number of l's Acquire calls registered as waiting for key.
func Waiters(l *Locker, key string) int {
	if l.notes == nil {
		return 0
	}
	l.notes.mu.Lock()
	defer l.notes.mu.Unlock()
	return len(l.notes.subs[key])
}

// SetAnnounceDelay sets how long a release by a Locker that had waiters
// lately goes unannounced.
func SetAnnounceDelay(l *Locker, d time.Duration) { l.announcer.delay = d }

// LeaseKey is the lock name of a lease l granted.
func LeaseKey(l driver.Lease) string { return l.(*lease).key }

// WaitedFor reports whether key's row is marked as waited for by a waiter
// that listens (PostgreSQL).
func WaitedFor(l *Locker, key string) bool {
	var marked bool
	err := l.db.Raw("SELECT waiting_until > "+l.d.now+" FROM "+l.table+" WHERE name = ?", key).Scan(&marked).Error
	return err == nil && marked
}

// QueryRow runs l's row-returning statement path (queryRow).
func QueryRow(ctx context.Context, l *Locker, query string, args []any, dest ...any) error {
	return l.queryRow(ctx, query, args, dest...)
}

// Hot reports whether l's listener runs, as it does while l has waiters and
// for a while after.
func Hot(l *Locker) bool { return l.notes.hot() }

// RefreshStatement is the statement, with its arguments, that a PostgreSQL
// batch renewal of leases of l on keys, in that order, sends.
func RefreshStatement(l *Locker, keys []string, ttl time.Duration) (string, []any) {
	b := batch{leases: make([]driver.Lease, len(keys)), order: make([]int32, len(keys))}
	for i := range keys {
		b.leases[i] = &lease{l: l, key: keys[i], seq: uint64(i + 1)}
		b.order[i] = int32(i)
	}
	r := l.refreshArrays(b, ttl)
	return r.update, r.args
}

// Now is the expression l's statements read the database's clock with, in
// integer microseconds since the Unix epoch.
func Now(l *Locker) string { return l.d.now }

// Attempt is one attempt of a waiter that listens, which marks key's row as
// waited for at least pause when the lock is held; taken reports whether it
// took the lock, and left the holder's time left as the attempt read it.
func Attempt(ctx context.Context, l *Locker, key string, ttl, pause time.Duration) (taken bool, left time.Duration, err error) {
	got, left, err := l.try(ctx, key, ttl, "", true, pause, false)
	return got != nil, left, err
}

// Poll is Attempt for a waiter that no notification woke, which reads the
// row before it marks or takes it (poll).
func Poll(ctx context.Context, l *Locker, key string, ttl, pause time.Duration) (taken bool, left time.Duration, err error) {
	got, left, err := l.try(ctx, key, ttl, "", true, pause, true)
	return got != nil, left, err
}

// CycleStatements are the statements of l's uncontended lock cycle, in the
// driver's placeholders: the acquisition (key, owner, ttl in µs, answering
// the version) and the release (key, owner, version).
func CycleStatements(l *Locker) (acquire, release string) { return l.q.acquire, l.q.release }

// GivingBack is the number of l's give-backs running.
func GivingBack(l *Locker) int32 { return l.givingBack.Load() }

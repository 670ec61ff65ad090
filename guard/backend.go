package guard

import (
	"context"
	"time"
)

// Locker is what a backend implements: the smallest contract that lets guard
// offer exclusive critical sections on top of it. Like a database/sql driver,
// a Locker knows nothing of watchdogs, reentrancy or tracing; guard.Guard adds
// those for every backend alike.
//
// Keys reach the backend already validated and prefixed by guard.
type Locker interface {
	// Acquire makes one attempt to take key for opts.TTL. When the key is held
	// by someone else it returns ErrNotAcquired, unless opts.Wait is set: then it
	// blocks, woken by the backend's own notification rather than by polling,
	// until the lock is acquired or ctx is done, in which case it returns
	// ctx's error and leaves nothing behind (no queued waiter, no key).
	// A backend that cannot be reached returns an error wrapping ErrUnavailable.
	Acquire(ctx context.Context, key string, opts AcquireOptions) (Lease, error)
}

// AcquireOptions are the per-acquisition settings guard passes to a backend.
type AcquireOptions struct {
	// TTL is how long the lease lives without a refresh. It is counted by the
	// backend's clock (Redis PX, an etcd lease, the database's now()), never by
	// comparing application clocks. Always positive.
	TTL time.Duration
	// Wait asks Acquire to block until the lock is free instead of failing.
	Wait bool
	// Fair asks for first-come, first-served handoff among waiters. A backend
	// that cannot honour it returns an error wrapping ErrUnsupported.
	Fair bool
}

// Lease is one holding of a lock, as the backend sees it.
type Lease interface {
	// Key is the key the lease was acquired for.
	Key() string
	// Token is the fencing token: strictly greater than the token of every
	// earlier lease on the same key, whoever held it. Storage that the lock
	// protects can refuse writes carrying an older token.
	Token() uint64
	// Refresh extends the lease to ttl from now (the backend's now). It returns
	// ErrNotHeld when the lease has already been lost (expired, taken over,
	// session gone): that is final. Any other error may be transient.
	Refresh(ctx context.Context, ttl time.Duration) error
	// Release gives the lock up. Only the owner's lease is removed: a lease
	// that expired and was taken by another owner is left alone and
	// ErrNotHeld is returned. Releasing twice is not an error.
	Release(ctx context.Context) error
	// Done is closed when the backend learns on its own that the lease is gone
	// (a lost session, an expired etcd lease). Backends that only learn of a
	// loss through Refresh may return nil.
	Done() <-chan struct{}
}

// RWLocker is an optional capability: read/write locks, where many readers or
// one writer hold a key at a time and a waiting writer is not starved by a
// stream of new readers.
type RWLocker interface {
	AcquireRead(ctx context.Context, key string, opts AcquireOptions) (Lease, error)
	AcquireWrite(ctx context.Context, key string, opts AcquireOptions) (Lease, error)
}

// Semaphorer is an optional capability: counting semaphores, where up to
// permits leases hold a key at once. Each permit is an expiring lease, so the
// permit of a holder that crashed comes back after its TTL.
type Semaphorer interface {
	AcquireSemaphore(ctx context.Context, key string, permits int, opts AcquireOptions) (Lease, error)
}

// BatchRefresher is an optional capability: refreshing many leases of this
// backend in one round trip. guard's watchdog uses it when present, so the
// cost of keeping N locks alive is one request per tick instead of N.
type BatchRefresher interface {
	// RefreshBatch refreshes every lease to ttl and returns one error per
	// lease, in order (nil where the refresh succeeded).
	RefreshBatch(ctx context.Context, leases []Lease, ttl time.Duration) []error
}

// Package driver is the contract a warden lock backend implements, the way
// database/sql/driver is for SQL drivers. Users never call it: they call
// guard.Guard, which owns each lease's life (renewal, loss, release once,
// reentrancy, tracing, the key namespace) for every backend alike. A backend
// imports this package, never guard.
//
// A backend implements Locker, and any of the optional capabilities
// (RWLocker, Semaphorer, BatchRefresher, Limiter, Inspector, Lister,
// ForceReleaser, Pinger, and ContextBounded or DeadlineBounded, which let
// guard call it on the caller's goroutine) it can honour; guard finds
// them by type assertion. Its leases implement Lease, or SessionLease when a
// session of the backend keeps them alive on its own (and RevocableLease
// when the backend can tell such a lease it was taken from it).
package driver

import (
	"context"
	"time"
)

// Locker takes locks on one backend.
//
// Keys reach the backend validated (1 to 200 bytes of UTF-8 without control
// characters) and already namespaced by guard; a backend adds only the
// structural suffixes it needs (":lock", a znode path), never a prefix of its
// own.
type Locker interface {
	// Acquire makes one attempt to take key for opts.TTL. When the key is held
	// by someone else it returns ErrNotAcquired, unless opts.Wait is set: then
	// it blocks, woken by the backend's own notification where it has one,
	// until the lock is acquired or ctx is done, in which case it returns ctx's
	// error and leaves nothing behind (no queued waiter, no key). A backend
	// that cannot be reached returns an error wrapping ErrUnavailable (see
	// Unavailable); a waiting Acquire keeps trying through such errors until
	// ctx is done, and then returns ctx's error, carrying the last of them
	// where it has one (see Unreached): guard tells it to a caller whose
	// bound ran out with no answer, which would otherwise learn nothing of
	// why.
	Acquire(ctx context.Context, key string, opts AcquireOptions) (Lease, error)
}

// AcquireOptions are the per-acquisition settings guard passes to a backend.
type AcquireOptions struct {
	// TTL is how long the lease lives without a renewal, counted by the
	// backend's clock (Redis PX, an etcd lease, the database's now()), never
	// by comparing application clocks. Always positive and within the
	// backend's Limits.
	TTL time.Duration
	// Wait asks Acquire to block until the lock is free instead of failing.
	Wait bool
	// Fair asks for first-come, first-served handoff among waiters. A backend
	// that cannot honour it returns an error wrapping ErrUnsupported.
	Fair bool
	// Owner labels the holder (a process, a replica) for Inspector, which
	// reports it; it passed CheckOwner and may be empty. It never decides
	// ownership: leases are told apart by ids the backend makes itself.
	// Backends without Inspector ignore it.
	Owner string
}

// Lease is one holding of a lock, as the backend sees it. guard calls
// Release at most once, and never Refresh after Release has begun; a Refresh
// may still be in flight when Release is called.
type Lease interface {
	// Token is the fencing token: strictly greater than the token of every
	// earlier lease on the same key, whoever held it, within the guarantees
	// the backend documents. Storage that the lock protects can refuse writes
	// carrying an older token.
	Token() uint64
	// Expiry is the local time (with its monotonic reading) before which the
	// lease is surely still held on the server if nothing renews it: the send
	// time of the request that granted or last renewed it, plus its TTL, less
	// whatever clock drift the backend allows for. A successful Refresh moves
	// it. guard cancels the section a safety margin before it, so it must
	// never be later than the server's own expiry.
	Expiry() time.Time
	// Refresh extends the lease to ttl from now (the backend's now). It
	// returns an error wrapping ErrNotHeld when the lease has already been
	// lost (expired, taken over, session gone): that is final. Any other
	// error may be transient.
	Refresh(ctx context.Context, ttl time.Duration) error
	// Release gives the lock up. Only the owner's lease is removed: a lease
	// that expired and was taken by another owner is left alone and an error
	// wrapping ErrNotHeld is returned.
	Release(ctx context.Context) error
}

// SessionLease is a lease kept alive by a session of its backend (an etcd
// lease on its keepalive stream, a ZooKeeper session) rather than by Refresh:
// guard sends no request per lock for it and watches the session instead.
// Its Expiry is the session's. Session returns the same value on every
// call: guard finds a lock's session by it.
type SessionLease interface {
	Lease
	Session() Session
}

// RevocableLease is an optional capability of a SessionLease: the backend
// finds out when the lease is removed by someone else while its session
// lives (an operator's forced release). Without it, guard would learn of
// such a loss only at the release: the session's renewal, which is all it
// watches, goes on succeeding.
type RevocableLease interface {
	SessionLease
	// OnRevoke arranges for f to be called once, on a goroutine of the
	// backend's, when the lease is found removed by someone else; at once
	// if it already was. f must not block. Once the lease is released (or
	// its session lost), f is forgotten and never called.
	OnRevoke(f func())
}

// Session keeps many leases alive at once.
type Session interface {
	// Expiry is the local time before which the session is surely alive on
	// the server: the send time of its last answered renewal plus its TTL.
	// It is in the past once the session is known lost.
	Expiry() time.Time
	// Done is closed when the session is lost, revoked or closed; every
	// lease it kept is lost with it.
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
// backend in one round trip, so that keeping N locks alive costs one request
// per renewal period instead of N.
type BatchRefresher interface {
	// RefreshBatch refreshes every lease to ttl and returns one error per
	// lease, in order (nil where the refresh succeeded, which moves that
	// lease's Expiry). guard passes only leases this Locker granted.
	RefreshBatch(ctx context.Context, leases []Lease, ttl time.Duration) []error
}

// Pinger is an optional capability: checking that the backend answers, for
// health checks and for refusing to start on a wrong address. Ping returns
// nil when the backend answered a request within ctx, and otherwise an error
// wrapping ErrUnavailable (or ctx's error when ctx ended first). It never
// blocks past ctx's deadline, whatever the client's own timeouts.
type Pinger interface {
	Ping(ctx context.Context) error
}

// ContextBounded is an optional capability of a Locker whose every call
// (Acquire and the other capabilities, and its leases' Refresh and Release)
// returns promptly once its ctx is done, whatever happens on the network:
// an in-process backend, typically. guard calls such a backend on the
// caller's goroutine. Any other it calls on another goroutine (one of
// those the Guard keeps for such calls) whenever the caller's ctx can end,
// so that the caller gets its answer within its bound even from a client
// that ignores deadlines or retries past them, while the call that overran
// finishes in the background (and a lease it turns out to have granted is
// released).
type ContextBounded interface {
	Locker
	// BoundedByContext reports whether every call of this Locker returns
	// once its ctx is done.
	BoundedByContext() bool
}

// DeadlineBounded is an optional capability of a Locker whose every call
// (Acquire and the other capabilities, and its leases' Refresh and Release)
// returns promptly once its ctx's deadline has passed, though perhaps not
// when the ctx is cancelled before it: a network client that takes its
// connections' deadlines from the context, as go-redis does with
// ContextTimeoutEnabled. guard calls such a backend on the caller's
// goroutine when nothing but a deadline can end the call's context (a
// release, which guard bounds by its release timeout; an acquisition whose
// caller's context has no cancellation), and on one of its own otherwise,
// as for any backend that is not ContextBounded: handing a call to another
// goroutine and back costs a fast client a large share of its cycle. A
// waiting acquisition of a plain lock whose context can be cancelled (and
// whose bounds are 10ms away or more) starts with one attempt that does
// not wait, on the caller's goroutine, under a deadline of 10ms of guard's
// own, so that a cancellation is still honoured within guard's grace; the
// wait is handed off when that attempt fails. Such a backend should give
// back what an attempt that got no answer may have taken, should its
// request reach the server late (redislock does, within seconds).
type DeadlineBounded interface {
	Locker
	// BoundedByDeadline reports whether every call of this Locker returns
	// once its ctx's deadline has passed.
	BoundedByDeadline() bool
}

package httpmw

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/warden-go/warden/guard"
)

// DefaultLockWait is how long Lock waits for a held key before refusing.
const DefaultLockWait = 5 * time.Second

// LockOption configures the Lock middleware.
type LockOption func(*lockConfig)

type lockConfig struct {
	wait       time.Duration
	status     int
	retryAfter time.Duration
	lockOpts   []guard.LockOption
}

// WithLockWait bounds how long a request waits for its key (default
// DefaultLockWait); 0 or less refuses at once when the key is held.
func WithLockWait(d time.Duration) LockOption {
	return func(c *lockConfig) { c.wait = max(d, 0) }
}

// WithLockedStatus answers a request whose key stayed held with 423 Locked
// instead of the default 409 Conflict.
func WithLockedStatus() LockOption {
	return func(c *lockConfig) { c.status = http.StatusLocked }
}

// WithLockRetryAfter sets the Retry-After sent with a refusal (default
// DefaultRetryAfter); 0 sends none. Lock refuses a negative one.
func WithLockRetryAfter(d time.Duration) LockOption {
	return func(c *lockConfig) { c.retryAfter = d }
}

// WithGuardOptions passes options to every acquisition (guard.TTL,
// guard.Fair, ...). The wait bound is WithLockWait's.
func WithGuardOptions(opts ...guard.LockOption) LockOption {
	return func(c *lockConfig) { c.lockOpts = append(c.lockOpts, opts...) }
}

// Lock returns middleware that runs each request while holding the lock
// named by key(r) in g (per user, per order), so that requests with the same
// key run one at a time, across every server sharing g's backend. A request
// waits up to WithLockWait for the key, then gets 409 (or 423) problem+json
// with Retry-After. A key of "" means the request needs no lock and passes
// through. The handler's context is the lock's: if the lock is lost while it
// runs, the context is cancelled with cause guard.ErrLockLost, so the
// handler stops before a second holder works beside it. The lock is released
// when the handler returns or panics.
//
// The wait is bounded by g whatever its backend's client does: a request
// is answered within WithLockWait (or its own context's deadline) and a few
// tens of milliseconds. A backend that cannot be reached meanwhile gets 503
// "Lock unavailable" with Retry-After, never 409: an outage is not
// contention.
//
// Every distinct key leaves state on the backend after its lock is
// released, which the backends keep so that fencing tokens never go
// backwards: a fence counter per key on Redis and RedLock, a row per key in
// the SQL lock table. A key made from request data (a user id, an order
// number) therefore lets clients create such state at will. Derive keys from
// values the service has checked (an authenticated user, an order that
// exists), and reclaim the state of idle keys as the backend's package
// documentation describes. Keys share g's names with every other lock
// taken on it, a scheduler's jobs among them: a request whose key equals a
// job's name holds that job's lock, and the job skips its slot meanwhile.
// Give request keys a namespace of their own ("user/"+id), or the
// middleware a Guard of its own prefix.
//
// Lock refuses a nil g, a nil key function and a nil or out-of-range option
// with an error wrapping guard.ErrInvalidOption, as Idempotency does, so
// that a misconfigured service fails when it starts, not on its requests.
func Lock(g *guard.Guard, key func(*http.Request) string, opts ...LockOption) (func(http.Handler) http.Handler, error) {
	c := lockConfig{wait: DefaultLockWait, status: http.StatusConflict, retryAfter: DefaultRetryAfter}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("warden: httpmw: lock: %w: option %d is nil", guard.ErrInvalidOption, i)
		}
		o(&c)
	}
	switch {
	case g == nil:
		return nil, fmt.Errorf("warden: httpmw: lock: %w: nil Guard", guard.ErrInvalidOption)
	case key == nil:
		return nil, fmt.Errorf("warden: httpmw: lock: %w: nil key function", guard.ErrInvalidOption)
	case c.retryAfter < 0:
		return nil, fmt.Errorf("warden: httpmw: lock: %w: Retry-After %v is negative", guard.ErrInvalidOption, c.retryAfter)
	}
	for i, o := range c.lockOpts {
		if o == nil {
			return nil, fmt.Errorf("warden: httpmw: lock: %w: guard option %d is nil", guard.ErrInvalidOption, i)
		}
	}
	if err := g.ValidateLockOptions(c.lockOpts...); err != nil {
		return nil, fmt.Errorf("warden: httpmw: lock: guard options: %w", err)
	}
	lockOpts := append(append([]guard.LockOption(nil), c.lockOpts...), guard.WaitAtMost(c.wait))
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k := key(r)
			if k == "" {
				next.ServeHTTP(w, r)
				return
			}
			l, err := g.Lock(r.Context(), k, lockOpts...)
			switch {
			case err == nil:
			case r.Context().Err() != nil:
				writeProblem(w, http.StatusServiceUnavailable, "Canceled", "Request canceled", "", 0)
				return
			case errors.Is(err, guard.ErrUnavailable):
				writeProblem(w, http.StatusServiceUnavailable, "Lock_unavailable", "Lock unavailable",
					"The lock service could not be reached; retry later.", c.retryAfter)
				return
			case errors.Is(err, guard.ErrNotAcquired):
				writeProblem(w, c.status, "Locked", "Resource busy",
					"Another request on the same resource is in progress; retry later.", c.retryAfter)
				return
			case errors.Is(err, guard.ErrInvalidKey):
				// The key is the service's own naming: it is logged, never
				// echoed to the client.
				g.Logger().WarnContext(r.Context(), "warden/httpmw: the request's lock key is invalid", "error", err)
				writeProblem(w, http.StatusBadRequest, "Invalid_lock_key", "Invalid lock key",
					"The request names a resource that cannot be locked.", 0)
				return
			default:
				g.Logger().ErrorContext(r.Context(), "warden/httpmw: the request's lock could not be taken", "error", err)
				writeProblem(w, http.StatusServiceUnavailable, "Lock_unavailable", "Lock unavailable", "", c.retryAfter)
				return
			}
			// Released even when the client left or the handler panics.
			defer l.Unlock(context.WithoutCancel(r.Context()))
			next.ServeHTTP(w, r.WithContext(l.Context()))
		})
	}, nil
}

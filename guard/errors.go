package guard

import (
	"errors"

	"github.com/warden-go/warden/guard/driver"
)

// Sentinel errors, the same values as package driver's, so that an error
// from a backend and one from guard match alike. Test for them with
// errors.Is; returned errors wrap them with the detail (the key, the option,
// the cause). Context cancellation is reported as the context's own error,
// not as one of these.
var (
	// ErrNotAcquired: the lock is held by someone else and the caller did not
	// wait, or its wait bound ran out first.
	ErrNotAcquired = driver.ErrNotAcquired
	// ErrLockLost: a held lock was lost (not renewed before its expiry,
	// taken over, session expired). It is the cause of the cancelled
	// critical-section context, and Do, DoAll and Unlock report it.
	ErrLockLost = driver.ErrLockLost
	// ErrNotHeld: the lock is no longer held by this lease, e.g. an unlock
	// after the lease expired. A lost lock's error matches it too.
	ErrNotHeld = driver.ErrNotHeld
	// ErrInvalidKey: the key is empty, longer than MaxKeyLen, not valid
	// UTF-8, or has control or bidirectional characters (ValidateKey).
	ErrInvalidKey = driver.ErrInvalidKey
	// ErrInvalidOption: an option value is out of range or contradicts
	// another, or the backend cannot honour it (a TTL outside its limits).
	ErrInvalidOption = driver.ErrInvalidOption
	// ErrUnsupported: the backend does not offer the requested capability
	// (read/write locks, semaphores, fair mode).
	ErrUnsupported = driver.ErrUnsupported
	// ErrUnavailable: the backend could not be reached or failed. The
	// underlying error is wrapped as well.
	ErrUnavailable = driver.ErrUnavailable
	// ErrNotSent: a failed request changed nothing, provably: it never
	// left the client, or the backend refused it whole (driver.NotSent
	// says what a backend takes for proof). A forced release, or an
	// idempotency record's delete, whose error matches it was not done;
	// one whose error does not may have been, however unavailable the
	// backend looks.
	ErrNotSent = driver.ErrNotSent
)

// lockError is an error about one lock: `warden: lock "k"` once, then what
// happened. It matches its sentinel (and, for a loss, ErrNotHeld as well) and
// unwraps to its cause.
type lockError struct {
	key      string
	sentinel error // ErrLockLost, ErrNotAcquired, ...; nil: only the cause
	cause    error
}

func (e *lockError) Error() string {
	s := "warden: lock " + quote(e.key)
	if e.sentinel != nil {
		s += " " + e.sentinel.Error()
	}
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

func (e *lockError) Is(target error) bool {
	if e.sentinel == nil {
		return false
	}
	return target == e.sentinel || (e.sentinel == ErrLockLost && target == ErrNotHeld)
}

func (e *lockError) Unwrap() error { return e.cause }

// wrapLockErr names key in err, a backend's or guard's error about it. A
// sentinel at the head of err is lifted next to the key (`lock "k" not
// acquired`), so it is not said twice.
func wrapLockErr(key string, err error) error {
	for _, s := range []error{ErrNotAcquired, ErrInvalidKey, ErrInvalidOption, ErrUnsupported, ErrNotHeld} {
		if err == s {
			return &lockError{key: key, sentinel: s}
		}
	}
	return &lockError{key: key, cause: err}
}

func lostError(key string, cause error) *lockError {
	return &lockError{key: key, sentinel: ErrLockLost, cause: cause}
}

var errUnlocked = errors.New("unlocked")

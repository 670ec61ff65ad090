package guard

import "errors"

// Sentinel errors. Test for them with errors.Is; errors returned by guard and
// by backends wrap them with the detail (the key, the option, the cause).
// Context cancellation is reported as the context's own error, not as one of
// these.
var (
	// ErrNotAcquired: the lock is held by someone else and the caller did not
	// wait, or its wait bound ran out first.
	ErrNotAcquired = errors.New("warden: lock not acquired")
	// ErrLockLost: a held lock was lost (refresh failed for good, session
	// expired). It is the cause of the cancelled critical-section context.
	ErrLockLost = errors.New("warden: lock lost")
	// ErrNotHeld: the lock is no longer held by this lease, e.g. an unlock or
	// refresh after the lease expired.
	ErrNotHeld = errors.New("warden: lock not held")
	// ErrInvalidKey: the key is empty, too long, or has control characters.
	ErrInvalidKey = errors.New("warden: invalid key")
	// ErrInvalidOption: an option value is out of range.
	ErrInvalidOption = errors.New("warden: invalid option")
	// ErrUnsupported: the backend does not offer the requested capability
	// (read/write locks, semaphores, fair mode).
	ErrUnsupported = errors.New("warden: unsupported by backend")
	// ErrUnavailable: the backend could not be reached or failed. The
	// underlying error is wrapped as well.
	ErrUnavailable = errors.New("warden: backend unavailable")
)

package driver

import (
	"context"
	"errors"
	"fmt"
)

// Sentinel errors. guard re-exports them under the same names; test for them
// with errors.Is. Their texts are short because every layer above adds the
// key and the operation: a user reads `warden: lock "reports/daily" lost:
// not held: taken over`, not the same words three times.
var (
	// ErrNotAcquired: the lock is held by someone else and the caller did not
	// wait, or its wait bound ran out first.
	ErrNotAcquired = errors.New("not acquired")
	// ErrLockLost: a held lock was lost (not renewed before its expiry, taken
	// over, session expired). It is the cause of the cancelled critical
	// section's context.
	ErrLockLost = errors.New("lost")
	// ErrNotHeld: the lease is no longer this owner's, e.g. a refresh or
	// release after it expired.
	ErrNotHeld = errors.New("not held")
	// ErrInvalidKey: the key is empty, too long, or has control characters.
	ErrInvalidKey = errors.New("invalid key")
	// ErrInvalidOption: an option value is out of range or contradicts
	// another.
	ErrInvalidOption = errors.New("invalid option")
	// ErrUnsupported: the backend does not offer the requested capability
	// (read/write locks, semaphores, fair mode).
	ErrUnsupported = errors.New("unsupported by the backend")
	// ErrUnavailable: the backend could not be reached or failed. The
	// underlying error is wrapped as well.
	ErrUnavailable = errors.New("backend unavailable")
)

// Unavailable wraps err, the failure of a call to the backend, in
// ErrUnavailable, except that a call cut short by ctx reports ctx's own
// error, so that callers see their own cancellation as such. A nil err stays
// nil.
func Unavailable(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

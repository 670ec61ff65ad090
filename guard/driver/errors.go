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
	// ErrNotSent: a request that failed changed nothing, provably (see
	// NotSent). It marks a failure that also matches another sentinel,
	// most often ErrUnavailable, or the context's error.
	ErrNotSent = errors.New("not sent")
)

// NotSent marks err, the failure of a call that would change what the
// backend keeps (a forced release, an idempotency record's delete or
// abandon, a fenced write: no backend marks a lease's own Release), as one
// that provably changed nothing, so that a caller may say "not done"
// rather than "may have been done", and may send it again without doing
// it twice: errors.Is(err, ErrNotSent) is then true, and the text and the
// chain stay err's. A nil err stays nil.
//
// A backend marks only what its client's error, or its own order of
// requests, proves: the change was never sent, because no connection could
// be made for it (a dial refused or timed out), the client's pool gave none,
// the client is closed, or the context was done before the send; a request
// the backend sends before the change (reading the holder) failed, so the
// change was never sent; or the server refused the change whole, running
// none of it or undoing all it ran (a read-only transaction's, a read-only
// server's or a permission's refusal, a transaction that failed its checks).
// A request written on a connection that then broke, or whose answer timed
// out, is never marked: the server may have run it. Nor is one the client
// may have sent more than once, unless each earlier send is proved to have
// changed nothing too.
func NotSent(err error) error {
	if err == nil {
		return nil
	}
	return notSent{err}
}

type notSent struct{ error }

func (e notSent) Is(target error) bool { return target == ErrNotSent }
func (e notSent) Unwrap() error        { return e.error }

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

// Unreached is the error of a waiting acquisition that ctx ended after its
// attempts failed, the last with last (an ErrUnavailable): an
// *UnreachedError that matches ctx's error and last, whose text says both.
// With a nil last, or ctx not done, it is ctx.Err().
func Unreached(ctx context.Context, last error) error {
	cerr := ctx.Err()
	if last == nil || cerr == nil {
		return cerr
	}
	return &UnreachedError{Ctx: cerr, Last: last}
}

// UnreachedError is a wait that ended with its context while the backend
// could not be reached: the context's error, and the last attempt's
// failure. A caller whose wait ran out reads from it why no attempt got an
// answer, where the context's error alone would say only that time was up.
type UnreachedError struct {
	Ctx  error // the context's error
	Last error // the last attempt's failure, an ErrUnavailable
}

func (e *UnreachedError) Error() string {
	return e.Ctx.Error() + " (the last attempt: " + e.Last.Error() + ")"
}

// Unwrap returns both, so that errors.Is finds either.
func (e *UnreachedError) Unwrap() []error { return []error{e.Ctx, e.Last} }

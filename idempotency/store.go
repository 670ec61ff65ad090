package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warden-go/warden/guard"
)

// Sentinel errors, for errors.Is.
var (
	// ErrInProgress: another caller holds a live claim on the key and has
	// not finished.
	ErrInProgress = errors.New("warden/idempotency: request in progress")
	// ErrFingerprintMismatch: the key was used before with a different
	// request (a different fingerprint).
	ErrFingerprintMismatch = errors.New("warden/idempotency: key reused with a different request")
	// ErrNotOwner: the claim named by an owner token is no longer that
	// owner's (its lease expired and another caller claimed the key, or it
	// was completed or abandoned). A stale owner's write is refused with it.
	ErrNotOwner = errors.New("warden/idempotency: claim not owned")
	// ErrNotFound: no live record under the key.
	ErrNotFound = errors.New("warden/idempotency: no record")
	// ErrInvalid: an argument is out of range (empty key, non-positive lease).
	ErrInvalid = errors.New("warden/idempotency: invalid argument")
	// ErrUnavailable is guard.ErrUnavailable: the store could not be reached.
	ErrUnavailable = guard.ErrUnavailable
	// ErrTooLarge: Complete was given a response larger than the store
	// keeps (more than MaxResponseLen). The store changed nothing: the claim
	// is still the owner's, which may complete it with a smaller record.
	ErrTooLarge = errors.New("warden/idempotency: record too large for the store")
	// ErrNotReplayable: the key's work was executed but its result could
	// not be kept (too large, streamed, handed over), so a repeat gets
	// neither the result nor a second run. Func returns an error wrapping
	// it to say so of its own result; Do returns one for such a key.
	ErrNotReplayable = errors.New("warden/idempotency: executed, result not stored")
)

// Deleter is an optional capability of a store: an operator removing a
// record, in progress or completed, so that its key runs afresh (a
// completed record holding a wrong response, a claim whose owner hangs).
// An owner still working under a removed claim finds it gone, with
// ErrNotOwner, at its next Extend or Complete.
//
// Delete removes the record only while its owner is owner, the one the
// operator was shown: a record of another owner (the claim shown lapsed and
// another request claimed the key, or completed it) is left, and Delete
// returns an error wrapping ErrNotOwner, so that an operator's late answer
// never removes work nobody showed them. An empty owner removes the record
// whoever owns it. Delete returns an error wrapping ErrNotFound when there
// was no record. A failure that proves the record untouched (the delete
// never left, or the backend refused it whole) matches guard.ErrNotSent;
// any other failure may have come after the delete was done.
type Deleter interface {
	Delete(ctx context.Context, scope, key, owner string) error
}

// State is the state of a record.
type State string

const (
	// StateInProgress: claimed by an owner that has not finished. The claim
	// lives until its lease expires unless the owner extends it.
	StateInProgress State = "in_progress"
	// StateCompleted: finished; the response is kept for replay until the
	// retention runs out.
	StateCompleted State = "completed"
)

// Limits every store accepts. Scope and Key are opaque byte strings, not
// necessarily UTF-8 (they may hold any byte, NUL included): a store that keeps
// them in a text column or joins them into one key encodes them (hex, base64,
// length prefixes) so that no two (Scope, Key) pairs collide and Record gives
// them back byte for byte.
const (
	// MaxKeyLen bounds Key, in bytes: the Idempotency-Key header allows 255
	// characters.
	MaxKeyLen = 255
	// MaxScopeLen bounds Scope, in bytes. Scope may be empty.
	MaxScopeLen = 255
	// MaxResponseLen is the largest Response every store must keep. Callers
	// never pass more.
	MaxResponseLen = 1 << 20
	// MaxFingerprintLen bounds a Claim's Fingerprint, in bytes, opaque as
	// Key is. The Executor takes a fingerprint of any length, and stores a
	// longer one as its SHA-256.
	MaxFingerprintLen = 1024
)

// ReservedScopePrefix begins the scopes warden's own packages claim keys
// in (the scheduler's slots: "warden.scheduler"). httpmw never stores a
// request's scope in that form, so that no caller who can choose their
// scope (a user who names themselves "warden.scheduler") can claim, and so
// suppress, a scheduled run, and an Executor refuses it in WithScope.
const ReservedScopePrefix = "warden."

// CheckKey returns an error wrapping ErrInvalid when (scope, key) is outside
// the limits: an empty key, a key longer than MaxKeyLen or a scope longer
// than MaxScopeLen. Stores call it before touching their backend.
func CheckKey(scope, key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalid)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key of %d bytes, more than %d", ErrInvalid, len(key), MaxKeyLen)
	case len(scope) > MaxScopeLen:
		return fmt.Errorf("%w: scope of %d bytes, more than %d", ErrInvalid, len(scope), MaxScopeLen)
	}
	return nil
}

// CheckFingerprint returns an error wrapping ErrInvalid when fingerprint is
// longer than MaxFingerprintLen.
func CheckFingerprint(fingerprint string) error {
	if len(fingerprint) > MaxFingerprintLen {
		return fmt.Errorf("%w: fingerprint of %d bytes, more than %d", ErrInvalid, len(fingerprint), MaxFingerprintLen)
	}
	return nil
}

// CheckContext returns an error wrapping ErrInvalid when ctx is nil, as
// guard does for the same input: a nil context is a caller's bug, and an
// error says so where a panic would take the process down. Stores call it
// first in every method.
func CheckContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context", ErrInvalid)
	}
	return nil
}

// CheckResponse returns an error wrapping ErrTooLarge when response is
// longer than MaxResponseLen, the most every store keeps. Stores call it in
// Complete before touching their backend, so that an oversized record is
// refused the same way everywhere rather than by whatever limit the backend
// hits first (a request size, a packet size, a dropped connection).
func CheckResponse(response []byte) error {
	if len(response) > MaxResponseLen {
		return fmt.Errorf("%w: response of %d bytes, more than %d", ErrTooLarge, len(response), MaxResponseLen)
	}
	return nil
}

// CheckOwner returns an error wrapping ErrInvalid when owner is empty.
func CheckOwner(owner string) error {
	if owner == "" {
		return fmt.Errorf("%w: empty owner token", ErrInvalid)
	}
	return nil
}

// CheckDuration returns an error wrapping ErrInvalid when d, a lease or a
// retention, is not positive. (The Executor asks more of its own options:
// at least MinDuration.)
func CheckDuration(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: non-positive duration %v", ErrInvalid, d)
	}
	return nil
}

// Check returns an error wrapping ErrInvalid when c is outside the limits.
func (c Claim) Check() error {
	return errors.Join(CheckKey(c.Scope, c.Key), CheckFingerprint(c.Fingerprint), CheckOwner(c.Owner), CheckDuration(c.Lease))
}

// Record is what a store holds under (Scope, Key).
type Record struct {
	Scope       string
	Key         string
	State       State
	Fingerprint string
	// Owner is the token of the claim that wrote the record.
	Owner string
	// Response is the stored result, opaque to the store (set when
	// completed).
	Response []byte
}

// Claim asks a store to take (Scope, Key) for Owner.
type Claim struct {
	// Scope separates principals: the same Key under two scopes is two
	// records, so one user can never be answered with another's response.
	Scope string
	Key   string
	// Fingerprint identifies the request; a later request with the same
	// key and a different fingerprint is refused. At most
	// MaxFingerprintLen bytes.
	Fingerprint string
	// Owner is a token unique to this claim (random, unguessable). Later
	// Extend, Complete and Abandon calls must present it.
	Owner string
	// Lease is how long the in-progress claim lives without an Extend,
	// counted on the store's clock.
	Lease time.Duration
}

// Store is what an idempotency backend implements: one compare-and-set per
// call, so that concurrent callers on several machines agree on one owner.
// Implementations live beside the lock backends (memory here; Redis, SQL and
// etcd in their packages) and pass the suite in idempotency/storetest.
type Store interface {
	// Every method returns an error wrapping ErrInvalid for arguments
	// outside the limits (see CheckContext, CheckKey, CheckOwner,
	// CheckDuration, Claim.Check), never a panic, and one
	// wrapping ErrUnavailable when the backend cannot be reached.
	//
	// Claim atomically writes an in-progress record for c.Owner when there
	// is no live record under (c.Scope, c.Key): none at all, an in-progress
	// one whose lease expired, or a completed one past its retention. Expiry
	// is decided by the store's own check of the deadline it recorded, on
	// its clock, not only by an eviction TTL that may lag. It
	// then returns (nil, nil). Otherwise it changes nothing and returns the
	// live record, whatever its fingerprint: the caller decides.
	Claim(ctx context.Context, c Claim) (*Record, error)
	// Extend renews owner's in-progress lease to lease from now, or returns
	// ErrNotOwner. A lease that has expired is not revived, even when no one
	// has claimed the key since: a watcher may already have seen it free.
	Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error
	// Complete stores response and marks the record completed, kept for
	// retention from now (the store's now), only while owner still holds
	// the in-progress claim (its lease not expired);
	// otherwise it returns ErrNotOwner and changes nothing. A response
	// longer than MaxResponseLen is refused with ErrTooLarge (CheckResponse)
	// and changes nothing either. The response is opaque: a result that was
	// executed but is not replayable is a completed record like any other,
	// marked as such inside the bytes the Executor writes.
	Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error
	// Abandon removes owner's in-progress claim so that a retry can run. It
	// returns ErrNotOwner when the claim is not owner's (already released,
	// taken over, completed). A failure that proves the claim untouched
	// (the request never left, or the backend refused it whole) matches
	// guard.ErrNotSent; any other may have come after the claim was removed.
	Abandon(ctx context.Context, scope, key, owner string) error
	// Get returns the live record under (scope, key), or ErrNotFound.
	Get(ctx context.Context, scope, key string) (*Record, error)
}

// ClaimWatcher is implemented by a Store whose claims can end before their
// lease runs out, through something the store learns of first: Consul's
// Store keeps claims under a session, which Consul deletes with every claim
// on it once the session goes unrenewed, whatever the claims' leases. The
// Executor stops fn (cause ErrNotOwner) as soon as ClaimDone's channel is
// closed, rather than at its next renewal, which may come after the claim
// is gone and another caller has claimed the key.
type ClaimWatcher interface {
	Store
	// ClaimDone returns a channel that is closed once owner's claim under
	// (scope, key) may be gone before its lease ends, early enough for
	// fn to stop before another caller could claim the key; it is closed
	// at once when this store holds no such claim.
	ClaimDone(scope, key, owner string) <-chan struct{}
}

// ContextBounded is an optional capability of a Store whose every call
// returns promptly once its ctx is done, whatever happens on the network
// (MemoryStore, which never leaves the process). The Executor calls such a
// store on the caller's goroutine. Any other it calls on a goroutine of its
// own (kept for the next call: WithIdleCallers), so that the caller gets an
// answer within the call timeout
// (WithCallTimeout) even from a client that ignores deadlines or retries
// past them; the call that overran finishes in the background. A store
// that declares it wrongly breaks that bound.
type ContextBounded interface {
	Store
	// BoundedByContext reports whether every call of this Store returns
	// once its ctx is done.
	BoundedByContext() bool
}

// DeadlineBounded is an optional capability of a Store whose every call
// returns promptly once its ctx's deadline has passed, though perhaps not
// when the ctx is cancelled before it: a network client that takes its
// connections' deadlines from the context, as go-redis does with
// ContextTimeoutEnabled. The Executor calls such a store on the caller's
// goroutine when nothing but a deadline can end the call's context (the
// completion, renewals and give-backs, which it detaches from the caller's
// context and bounds by the call timeout; a claim under a context with no
// cancellation), and on a goroutine of its own otherwise. A store that
// declares it wrongly breaks the call timeout's bound.
type DeadlineBounded interface {
	Store
	// BoundedByDeadline reports whether every call of this Store returns
	// once its ctx's deadline has passed.
	BoundedByDeadline() bool
}

package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/warden-go/warden/internal/handoff"
)

// errNoAnswer is the failure of a store call not answered within its bound
// and handoff.Grace: the Executor answers for it, and the call goes on in
// the background.
var errNoAnswer = fmt.Errorf("%w: no answer from the store within the call timeout", ErrUnavailable)

// bounded calls f with ctx bounded by d, unless ctx's deadline comes
// first, and arg, and returns f's answer.
//
// A store that declares it returns once its ctx is done (cs nil: see
// ContextBounded) is called on the caller's goroutine. Any other is called
// on one of cs's goroutines, the only way to stop waiting for a client that
// does not return when its context ends: when no answer has come once the
// bound and handoff.Grace have passed, bounded returns errNoAnswer (or
// ctx's error, when the caller's ctx ended: its cancellation is no outage)
// with abandoned true, and f goes on; late, if not nil, is then given f's
// answer when it comes, so that a claim made after its caller stopped
// waiting is given back rather than left to block its key.
func bounded[A, T any](ctx context.Context, cs *handoff.Callers, d time.Duration, f func(context.Context, A) (T, error), arg A, late func(A, T, error)) (v T, abandoned bool, err error) {
	cctx := ctx
	if end, ok := ctx.Deadline(); !ok || time.Until(end) > d {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, d)
		// Cancelled once the answer is taken, or once the bound has
		// passed: never while the waiter could still take an answer that
		// is on its way.
		defer cancel()
	}
	if cs == nil {
		v, err := f(cctx, arg)
		return v, false, err
	}
	v, err = handoff.Wait(cs, &handoff.Call[A, T]{Ctx: cctx, F: f, Arg: arg, Late: late})
	if err != errNoAnswer {
		return v, false, err
	}
	if cerr := ctx.Err(); cerr != nil {
		return v, true, cerr
	}
	return v, true, err
}

// storeCall is what a call to the store needs: the claim it is about, and
// for a completion its payload.
type storeCall struct {
	e       *Executor
	ctx     context.Context // the caller's, for logs and metrics
	cfg     *config
	c       Claim
	hash    *keyHash
	payload []byte
}

// The requests the Executor makes, each with the store's error redacted:
// every store error the Executor logs, gives fn as its context's cause or
// returns comes through them.

func claimOn(ctx context.Context, s storeCall) (*Record, error) {
	rec, err := s.e.store.Claim(ctx, s.c)
	return rec, redact(err, s.c)
}

func getOn(ctx context.Context, s storeCall) (*Record, error) {
	rec, err := s.e.store.Get(ctx, s.c.Scope, s.c.Key)
	return rec, redact(err, s.c)
}

func completeOn(ctx context.Context, s storeCall) (struct{}, error) {
	return struct{}{}, redact(s.e.store.Complete(ctx, s.c.Scope, s.c.Key, s.c.Owner, s.payload, s.cfg.retention), s.c)
}

func extendOn(ctx context.Context, s storeCall) (struct{}, error) {
	return struct{}{}, redact(s.e.store.Extend(ctx, s.c.Scope, s.c.Key, s.c.Owner, s.cfg.lease), s.c)
}

func abandonOn(ctx context.Context, s storeCall) (struct{}, error) {
	return struct{}{}, redact(s.e.store.Abandon(ctx, s.c.Scope, s.c.Key, s.c.Owner), s.c)
}

// redactedError is a store's error whose message names c's key only as
// its hash. A store may quote the key in its errors (an ErrNotOwner's
// "extend of \"<key>\""); the Executor logs them, gives them to fn as
// its context's cause and returns them, and a key, often a secret-like
// token, appears in none of those but as its hash. errors.Is and errors.As
// still reach the store's error.
type redactedError struct {
	err error
	msg string
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// minVerbatimKey is the shortest key that is redacted where it appears
// unquoted too: a shorter one would be found inside the words of any
// message.
const minVerbatimKey = 8

// redact returns err with c's key, quoted (as %q quotes it) or, when at
// least minVerbatimKey bytes long, verbatim, replaced in its message by
// the key's hash.
func redact(err error, c Claim) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	quoted := strconv.Quote(c.Key)
	verbatim := len(c.Key) >= minVerbatimKey && strings.Contains(msg, c.Key)
	if !verbatim && !strings.Contains(msg, quoted) {
		return err
	}
	hash := "key hash " + KeyHash(c.Scope, c.Key)
	msg = strings.ReplaceAll(msg, quoted, hash)
	if verbatim {
		msg = strings.ReplaceAll(msg, c.Key, hash)
	}
	return &redactedError{err: err, msg: msg}
}

// lateClaim gives back s's claim, whose caller stopped waiting for it
// (bounded), unless its answer, come at last, says it was not made: made,
// or with its answer lost, it would hold the key in progress for its lease
// with nobody working. It runs on the claim's own goroutine and counts
// among the give-backs, so that a store answering a burst of claims late
// does not start more than maxGivingBack at once.
func lateClaim(s storeCall, rec *Record, err error) {
	switch {
	case errors.Is(err, ErrInvalid):
		return
	case err == nil && rec != nil && (rec.State != StateInProgress || rec.Owner != s.c.Owner):
		return // another caller's record: this claim was not made
	}
	e := s.e
	if e.givingBack.Add(1) > maxGivingBack {
		e.givingBack.Add(-1)
		return
	}
	e.giveBack(s.ctx, s.cfg, s.c, s.hash)
}

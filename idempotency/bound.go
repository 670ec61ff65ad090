package idempotency

import (
	"context"
	"errors"
	"fmt"
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

func claimOn(ctx context.Context, s storeCall) (*Record, error) { return s.e.store.Claim(ctx, s.c) }

func getOn(ctx context.Context, s storeCall) (*Record, error) {
	return s.e.store.Get(ctx, s.c.Scope, s.c.Key)
}

func completeOn(ctx context.Context, s storeCall) (struct{}, error) {
	return struct{}{}, s.e.store.Complete(ctx, s.c.Scope, s.c.Key, s.c.Owner, s.payload, s.cfg.retention)
}

func extendOn(ctx context.Context, s storeCall) (struct{}, error) {
	return struct{}{}, s.e.store.Extend(ctx, s.c.Scope, s.c.Key, s.c.Owner, s.cfg.lease)
}

func abandonOn(ctx context.Context, s storeCall) (struct{}, error) {
	return struct{}{}, s.e.store.Abandon(ctx, s.c.Scope, s.c.Key, s.c.Owner)
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

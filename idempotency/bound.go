package idempotency

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"
)

// grace is how long past a store call's bound the Executor waits for the
// store's own answer before it answers for it, as guard does for its
// backends: long enough for a store that honours its context to return,
// short enough that the bound holds within it. A client that ignores
// deadlines (go-redis without ContextTimeoutEnabled, which also resends a
// timed-out command) or one stuck on a connection the network black-holes
// is left behind.
const grace = 20 * time.Millisecond

// errNoAnswer is the failure of a store call not answered within its bound
// and grace: the Executor answers for it, and the call goes on in the
// background.
var errNoAnswer = fmt.Errorf("%w: no answer from the store within the call timeout", ErrUnavailable)

// States of a pending call: running until the store answers or its waiter
// gives up on it, whichever comes first.
const (
	callRunning int32 = iota
	callAnswered
	callAbandoned
)

// pending is a store call running on a goroutine of its own, one of the
// Executor's callers.
//
// The call is a function with its argument rather than a closure, and so
// is late: the functions are static, so that a call on the caller's
// goroutine allocates nothing for them, and one on a caller only its
// pending.
type pending[A, T any] struct {
	ctx    context.Context
	cancel context.CancelFunc // nil when ctx was the caller's own
	f      func(context.Context, A) (T, error)
	arg    A
	late   func(A, T, error)

	state atomic.Int32
	done  chan struct{} // closed once answered
	v     T
	err   error
}

// run makes the call and hands its answer to the waiter, or to late once
// the waiter gave up. The call's context is cancelled only once the answer
// is handed over: the waiter reads a done context as the end of the bound,
// so a cancel first could, with this goroutine descheduled past the grace,
// have the waiter give up on an answer already here (and a claim made in
// time be given back).
func (p *pending[A, T]) run() {
	v, err := p.f(p.ctx, p.arg)
	p.v, p.err = v, err
	answered := p.state.CompareAndSwap(callRunning, callAnswered)
	if answered {
		close(p.done)
	}
	if p.cancel != nil {
		p.cancel()
	}
	if !answered && p.late != nil {
		p.late(p.arg, v, err)
	}
}

// bounded calls f with ctx bounded by d, unless ctx's deadline comes
// first, and arg, and returns f's answer.
//
// A store that declares it returns once its ctx is done (cs nil: see
// ContextBounded) is called on the caller's goroutine. Any other is called
// on one of cs's goroutines, the only way to stop waiting for a client that
// does not return when its context ends: when no answer has come once the
// bound and grace have passed, bounded returns errNoAnswer (or ctx's
// error, when the caller's ctx ended: its cancellation is no outage) with
// abandoned true, and f goes on; late, if not nil, is then given f's answer
// when it comes, so that a claim made after its caller stopped waiting is
// given back rather than left to block its key.
func bounded[A, T any](ctx context.Context, cs *callers, d time.Duration, f func(context.Context, A) (T, error), arg A, late func(A, T, error)) (v T, abandoned bool, err error) {
	cctx, cancel := ctx, context.CancelFunc(nil)
	if end, ok := ctx.Deadline(); !ok || time.Until(end) > d {
		cctx, cancel = context.WithTimeout(ctx, d)
	}
	if cs == nil {
		v, err := f(cctx, arg)
		if cancel != nil {
			cancel()
		}
		return v, false, err
	}
	p := &pending[A, T]{ctx: cctx, cancel: cancel, f: f, arg: arg, late: late, done: make(chan struct{})}
	cs.start(p)
	select {
	case <-p.done:
		return p.v, false, p.err
	case <-cctx.Done():
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return p.v, false, p.err
	case <-t.C:
	}
	if !p.state.CompareAndSwap(callRunning, callAbandoned) {
		<-p.done // answered as the grace ran out
		return p.v, false, p.err
	}
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, true, err
	}
	return zero, true, errNoAnswer
}

// idleFor is how long a call goroutine waits idle for the Executor's next
// store call before it ends.
//
// A store call made on a goroutine of its own is not given a new one each
// time: a new goroutine's stack grows through the store's client on every
// call, as guard found for its lock calls (callgrind, go-redis, 2,000 first
// requests and 2,000 replays: 3.8 times the client instructions of calls on
// the caller's goroutine with a goroutine per call, 1.4 times with kept
// ones). Kept goroutines keep their grown stacks.
const idleFor = time.Second

// callers keeps an Executor's idle call goroutines, the most recently idle
// last (its stack the likeliest to be in cache).
type callers struct {
	maxIdle int // set by New, never changed
	mu      sync.Mutex
	idle    []*caller
}

// caller is a goroutine that runs one store call at a time.
type caller struct {
	calls chan task // room for one, so that handing a call over never waits
}

// task is a call handed to a caller.
type task interface{ run() }

// start runs t on an idle caller, or on a new one.
func (cs *callers) start(t task) {
	cs.mu.Lock()
	if n := len(cs.idle); n > 0 {
		c := cs.idle[n-1]
		cs.idle[n-1] = nil
		cs.idle = cs.idle[:n-1]
		cs.mu.Unlock()
		c.calls <- t
		return
	}
	cs.mu.Unlock()
	c := &caller{calls: make(chan task, 1)}
	c.calls <- t
	go c.loop(cs)
}

// loop runs the calls handed to c, then waits idle for the next one up to
// idleFor, and ends when none came, or when maxIdle are idle already. A call abandoned by its waiter keeps c busy until the store
// answers it: c is idle again only then.
func (c *caller) loop(cs *callers) {
	// Started by one call, it runs later ones too: the profiler labels it
	// inherited are that first call's, and would be charged with the
	// others' work.
	pprof.SetGoroutineLabels(context.Background())
	var wait *time.Timer
	t := <-c.calls
	for {
		t.run()
		if !cs.put(c) {
			return
		}
		if wait == nil {
			wait = time.NewTimer(idleFor)
		} else {
			wait.Reset(idleFor)
		}
		select {
		case t = <-c.calls:
			continue
		case <-wait.C:
		}
		if cs.retire(c) {
			return
		}
		t = <-c.calls // taken as it retired: its call is on its way
	}
}

// put makes c idle, unless maxIdle are.
func (cs *callers) put(c *caller) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.idle) >= cs.maxIdle {
		return false
	}
	cs.idle = append(cs.idle, c)
	return true
}

// retire takes c, idle for idleFor, out of the idle, and reports whether
// it was still there: false when a call was just handed to it.
func (cs *callers) retire(c *caller) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for i, idle := range cs.idle {
		if idle == c {
			cs.idle = append(cs.idle[:i], cs.idle[i+1:]...)
			return true
		}
	}
	return false
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

package guard

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// grace is how long past a call's bound guard waits for the backend's own
// answer before it answers for it: long enough for a backend that honours
// its context to return, short enough that a caller's bound holds within
// it. A client that ignores deadlines (go-redis without
// ContextTimeoutEnabled, which also retries a timed-out read) or detaches
// its requests from them (an etcd put run to its request timeout) is left
// behind.
const grace = 20 * time.Millisecond

// errNoAnswer is the failure of a call the backend did not answer within
// its bound: guard answers for it, and the call goes on in the background.
var errNoAnswer = fmt.Errorf("%w: no answer within the bound", ErrUnavailable)

// maxIdleFor is how long a call goroutine waits idle for its next call,
// at most.
//
// A call guard must be able to stop waiting for runs on a goroutine other
// than its caller's. Starting one per call is a large share of a fast
// backend's client cost: the goroutine's creation, and the growth of its
// stack through the client's calls, on every lock and unlock (callgrind,
// go-redis: about 50,000 of 125,000 client instructions per uncontended
// Do). So the goroutines are kept: each runs calls one after
// the other, and waits, idle, for the next one up to maxIdleFor; at most
// callers.maxIdle wait so (WithIdleCallers).
const maxIdleFor = time.Second

// callers keeps a Guard's idle call goroutines, the most recently idle
// last (it is the likeliest to have its stack grown and in cache).
//
// One timer per Guard retires the idle, rather than one per goroutine: a
// goroutine that waited on its own timer put it in the runtime's timer
// heap each time it went idle and took it out each time it was woken, on
// every call (callgrind, redislock's uncontended guard cycle at
// GOMAXPROCS=2: about 80k client instructions with it, 71k without). The
// timer ticks every maxIdleFor/2 while any goroutine is idle, and retires
// those idle since before the previous tick.
type callers struct {
	maxIdle int // set by New, never changed
	mu      sync.Mutex
	idle    []*caller
	reaper  *time.Timer // made on the first put; armed while idle is not empty
	armed   bool
	tick    uint64 // the reaper's ticks so far
}

// caller is a goroutine that runs one call at a time.
//
// It is made idle again by the waiter of its call once that took the
// answer, or by itself when the waiter stopped waiting: so a call's answer
// is never taken by the next call's waiter, and its channels serve every
// call it runs, allocated once.
type caller struct {
	calls     chan task     // the next call, given only to an idle caller (nil: end): room for one, so that giving it never waits for the goroutine to run
	done      chan struct{} // the answer of its call is in the call's pending: room for one, always free when a call starts
	idleSince uint64        // the callers' tick when it last went idle; guarded by callers.mu
}

// task is a call given to a caller.
type task interface {
	// run makes the call and signals done when its waiter is still
	// waiting, or reports that it stopped waiting.
	run(done chan<- struct{}) (abandoned bool)
}

// pending is a call running on a caller, whose waiter may stop waiting for
// it.
//
// The call is a function with its argument, rather than a closure: the
// functions are static, so that a call allocates only its pending.
type pending[A, T any] struct {
	ctx  context.Context
	f    func(context.Context, A) (T, error)
	arg  A
	undo func(A, T)

	mu        sync.Mutex
	abandoned bool
	v         T
	err       error
}

func (p *pending[A, T]) run(done chan<- struct{}) bool {
	v, err := p.f(p.ctx, p.arg)
	p.mu.Lock()
	if !p.abandoned {
		p.v, p.err = v, err
		done <- struct{}{}
		p.mu.Unlock()
		return false
	}
	p.mu.Unlock()
	if err == nil && p.undo != nil {
		p.undo(p.arg, v)
	}
	return true
}

// answer is p's answer, taken from c once done signalled it: c is idle
// again, or ended when maxIdle are.
func (p *pending[A, T]) answer(cs *callers, c *caller) (T, error) {
	if !cs.put(c) {
		c.calls <- nil
	}
	return p.v, p.err
}

// get returns an idle caller, or starts one.
func (cs *callers) get() *caller {
	cs.mu.Lock()
	if n := len(cs.idle); n > 0 {
		c := cs.idle[n-1]
		cs.idle[n-1] = nil
		cs.idle = cs.idle[:n-1]
		cs.mu.Unlock()
		return c
	}
	cs.mu.Unlock()
	c := &caller{calls: make(chan task, 1), done: make(chan struct{}, 1)}
	go c.run(cs)
	return c
}

// run runs the calls given to c, and ends when it is told to (by the
// reaper, or a waiter that found no room for it among the idle), or found
// no room itself after a call whose waiter stopped waiting.
func (c *caller) run(cs *callers) {
	// Started by one call, it runs later ones too: the profiler labels it
	// inherited (pprof.Do) are that first call's, and would be charged
	// with the others' work.
	pprof.SetGoroutineLabels(context.Background())
	for t := range c.calls {
		if t == nil {
			return
		}
		if t.run(c.done) && !cs.put(c) {
			return
		}
	}
}

// put makes c idle, unless maxIdle are.
func (cs *callers) put(c *caller) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.idle) >= cs.maxIdle {
		return false
	}
	c.idleSince = cs.tick
	cs.idle = append(cs.idle, c)
	if !cs.armed {
		cs.armed = true
		if cs.reaper == nil {
			cs.reaper = time.AfterFunc(maxIdleFor/2, cs.reap)
		} else {
			cs.reaper.Reset(maxIdleFor / 2)
		}
	}
	return true
}

// reap is the reaper's tick: it ends the callers idle since before the
// previous tick (between maxIdleFor/2 and maxIdleFor), and arms the
// reaper again while some stay idle. The idle are in the order they went
// idle, so those to end are at the bottom.
func (cs *callers) reap() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.tick++
	n := 0
	for n < len(cs.idle) && cs.tick-cs.idle[n].idleSince >= 2 {
		cs.idle[n].calls <- nil // idle, so its room is free
		n++
	}
	cs.idle = slices.Delete(cs.idle, 0, n)
	cs.armed = len(cs.idle) > 0
	if cs.armed {
		cs.reaper.Reset(maxIdleFor / 2)
	}
}

// call runs f with ctx and arg, and returns its answer or, once ctx is
// done and a grace period has passed without one, errNoAnswer. A backend
// that honours its context (direct) and a ctx that never ends need no such
// watch: f is then called on the caller's goroutine, which costs nothing.
// Otherwise f runs on one of cs's goroutines; when it is abandoned and
// later returns a value without an error, undo (if not nil) is applied to
// arg and that value there, so that a lease granted too late is given
// back, never left behind.
func call[A, T any](ctx context.Context, cs *callers, direct bool, f func(context.Context, A) (T, error), arg A, undo func(A, T)) (T, error) {
	if direct || ctx.Done() == nil {
		return f(ctx, arg)
	}
	return watch(cs, &pending[A, T]{ctx: ctx, f: f, arg: arg, undo: undo})
}

// watch runs p on one of cs's goroutines, and returns its answer or, once
// its ctx is done and a grace period has passed without one, errNoAnswer
// (call). p is the caller's to allocate, so that it can share the
// allocation of something the call needs anyway (the release's bound); it
// must not be used again.
func watch[A, T any](cs *callers, p *pending[A, T]) (T, error) {
	ctx := p.ctx
	c := cs.get()
	c.calls <- p
	select {
	case <-c.done:
		return p.answer(cs, c)
	case <-ctx.Done():
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return p.answer(cs, c)
	case <-t.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-c.done:
		return p.answer(cs, c)
	default:
	}
	p.abandoned = true
	var zero T
	return zero, errNoAnswer
}

// withCallTimeout bounds ctx by the Guard's call timeout, unless ctx's own
// deadline comes first.
func (g *Guard) withCallTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= g.callTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, g.callTimeout)
}

// bounded runs f, a request to the backend that grants nothing (a ping, an
// inspection), within ctx's deadline or the Guard's call timeout, whichever
// comes first.
func bounded[T any](g *Guard, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	cctx, cancel := g.withCallTimeout(ctx)
	defer cancel()
	v, err := call(cctx, &g.callers, g.direct, callFunc, f, nil)
	err = noAnswer(ctx, cctx, err)
	if err != nil && ctx.Err() != nil {
		err = cutShort(ctx, err)
	}
	return v, err
}

// callFunc calls f: a call whose argument is the function itself.
func callFunc[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	return f(ctx)
}

// noAnswer is err, the failure of a call made with cctx (derived from the
// caller's ctx), or errNoAnswer when the backend said only that cctx's
// deadline had cut the call short: it did not answer within the bound. An
// answer (the lock is held, an invalid option) stays what it is, and a
// cancellation by the caller is no outage.
func noAnswer(ctx, cctx context.Context, err error) error {
	if err != nil && errors.Is(cctx.Err(), context.DeadlineExceeded) && !errors.Is(ctx.Err(), context.Canceled) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return errNoAnswer
	}
	return err
}

// cutShort is the error of a call that the caller's ctx ended: ctx's own
// error, which also matches ErrUnavailable when the backend had failed, or
// not answered, by then (err).
func cutShort(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if errors.Is(err, ErrUnavailable) && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%w)", cerr, err)
	}
	return cerr
}

// probeShare is the part of a bounded wait kept for a last, non-waiting
// attempt: when the wait runs out, the backend has said nothing (a waiting
// acquisition ends with its context's error whether the lock was held or the
// backend could not be reached), and that attempt tells the two apart (and
// takes the lock if it is free after all). A tenth of the wait, between
// 10ms and 250ms, and never more than the wait.
func probeShare(wait time.Duration) time.Duration {
	return min(max(wait/10, 10*time.Millisecond), 250*time.Millisecond, wait)
}

// undoAcquire releases a lease granted to an acquisition whose caller had
// stopped waiting for it, so that it never holds the key for anyone.
func undoAcquire(a attemptCall, lease driver.Lease) {
	if lease == nil {
		return
	}
	g := a.g
	ctx, cancel := context.WithTimeout(context.Background(), g.releaseTimeout)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		g.logger.Warn("warden: a lease granted after its caller stopped waiting could not be released; it stays taken until it expires",
			"key", a.full, "backend", g.backend, "error", err)
	}
}

// boundKind says which bound ended an acquisition that found the lock held.
type boundKind uint8

const (
	boundNone    boundKind = iota // none: a single attempt found it held
	boundWait                     // the WaitAtMost bound
	boundContext                  // ctx's deadline, which came first
)

// acquireBounded makes the acquisition c asks for, and returns within its
// bound (ctx's deadline, the wait bound, or for a single attempt the call
// timeout) and grace, whatever the backend does. A bounded wait gives the
// last part of its time (probeShare) to one attempt that does not wait:
// its answer tells a lock still held (ErrNotAcquired) from a backend that
// cannot be reached (ErrUnavailable, or no answer in time), which the
// waiting call, ended by its context, cannot say; when it finds the lock
// held, the rest of the bound is waited out as well. (A fair waiter thus
// gives up its place in the queue for the last part of its wait.) It
// returns which bound ended an acquisition that found the lock held.
func (g *Guard) acquireBounded(ctx context.Context, full string, c *lockConfig) (driver.Lease, boundKind, error) {
	ctxEnd, hasEnd := ctx.Deadline()
	if c.wait < 0 && !hasEnd {
		// Nothing bounds it but ctx's cancellation, if even that.
		lease, err := g.attempt(ctx, full, c, true)
		return lease, boundNone, err
	}
	now := time.Now()
	end, kind := now.Add(g.callTimeout), boundNone
	if c.wait > 0 {
		end, kind = now.Add(c.wait), boundWait
	}
	if hasEnd && (c.wait < 0 || !ctxEnd.After(end)) {
		end, kind = ctxEnd, boundContext
	}
	if c.wait != 0 {
		if probeAt := end.Add(-probeShare(end.Sub(now))); probeAt.After(now) {
			wctx, cancel := context.WithDeadline(ctx, probeAt)
			lease, err := g.attempt(wctx, full, c, true)
			cancel()
			if err == nil || ctx.Err() != nil || wctx.Err() == nil {
				return lease, boundNone, err
			}
			if !time.Now().Before(end) {
				// No time is left for the last attempt (a late wake-up on
				// a busy machine): only a call that never answered shows
				// the backend out of reach; otherwise the wait ran out.
				if err != errNoAnswer {
					err = ErrNotAcquired
				}
				return nil, kind, err
			}
		}
	}
	pctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	lease, err := g.attempt(pctx, full, c, false)
	err = noAnswer(ctx, pctx, err)
	if c.wait == 0 {
		// A single attempt's ErrNotAcquired is its answer, whatever bound
		// it had.
		return lease, boundNone, err
	}
	if errors.Is(err, ErrNotAcquired) && time.Now().Before(end) {
		// The backend answers and the lock is held: wait out what is
		// left of the bound, so that a release in it is not missed.
		lease, werr := g.attempt(pctx, full, c, true)
		if werr == nil || ctx.Err() != nil || (errors.Is(werr, ErrUnavailable) && werr != errNoAnswer) {
			return lease, boundNone, werr
		}
	}
	return lease, kind, err
}

// attempt calls the backend for c (one attempt, or a wait) through call.
// The watched path copies c into its call, so that the uncontended path of
// a backend that honours its context allocates nothing for it.
func (g *Guard) attempt(ctx context.Context, full string, c *lockConfig, wait bool) (driver.Lease, error) {
	if g.direct || ctx.Done() == nil {
		return g.acquireLease(ctx, full, c, wait)
	}
	return call(ctx, &g.callers, false, attemptOn, attemptCall{g: g, full: full, c: *c, wait: wait}, undoAcquire)
}

// attemptCall is an acquisition made on a call goroutine.
type attemptCall struct {
	g    *Guard
	full string
	c    lockConfig
	wait bool
}

func attemptOn(ctx context.Context, a attemptCall) (driver.Lease, error) {
	return a.g.acquireLease(ctx, a.full, &a.c, a.wait)
}

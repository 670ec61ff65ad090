package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/internal/handoff"
)

// errNoAnswer is the failure of a call the backend did not answer within
// its bound and handoff.Grace: guard answers for it, and the call goes on
// in the background.
var errNoAnswer = fmt.Errorf("%w: no answer within the bound", ErrUnavailable)

// call runs f with ctx and arg, and returns its answer or, once ctx is
// done and handoff.Grace has passed without one, errNoAnswer. A backend
// that honours its context (direct) and a ctx that never ends need no such
// watch: f is then called on the caller's goroutine, which costs nothing.
// Otherwise f runs on one of cs's goroutines; when it is abandoned and
// later answers, late (if not nil) is given arg and that answer there, so
// that a lease granted too late is given back, never left behind.
func call[A, T any](ctx context.Context, cs *handoff.Callers, direct bool, f func(context.Context, A) (T, error), arg A, late func(A, T, error)) (T, error) {
	if direct || ctx.Done() == nil {
		return f(ctx, arg)
	}
	return handoff.Wait(cs, &handoff.Call[A, T]{Ctx: ctx, F: f, Arg: arg, Late: late})
}

// inline reports whether a call whose context guard derives from the
// caller's ctx with a deadline of its own runs on the caller's goroutine:
// when the backend returns once its ctx is done, or once its deadline has
// passed and ctx has no cancellation of its own, so that the derived
// context can end at its deadline only.
func (g *Guard) inline(ctx context.Context) bool {
	return g.direct || (g.byDeadline && ctx.Done() == nil)
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
	v, err := call(cctx, &g.callers, g.inline(ctx), callFunc, f, nil)
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
// caller's ctx), or errNoAnswer when the backend said only that a context
// had cut the call short while the caller's was not done, or cctx's
// deadline had: it did not answer within the bound. The caller's ctx being
// live is what tells, not cctx's error: a client that counts cctx's
// deadline itself (gRPC, under etcd) answers DeadlineExceeded a moment
// before cctx's own timer marks it done. An answer (the lock is held, an
// invalid option) stays what it is, and a cancellation by the caller is no
// outage.
func noAnswer(ctx, cctx context.Context, err error) error {
	if err == nil || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return err
	}
	if ctx.Err() == nil || (errors.Is(cctx.Err(), context.DeadlineExceeded) && !errors.Is(ctx.Err(), context.Canceled)) {
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
func undoAcquire(a attemptCall, lease driver.Lease, err error) {
	if err != nil || lease == nil {
		return
	}
	a.g.giveBack(a.full, lease, "a lease granted after its caller stopped waiting")
}

// giveBack releases lease, granted on full but not to be held (what says
// why), within the release timeout.
func (g *Guard) giveBack(full string, lease driver.Lease, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), g.releaseTimeout)
	defer cancel()
	// A lease no longer held (it ran out, or was taken away) holds
	// nothing to give back.
	if err := lease.Release(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
		g.logger.Warn("warden: "+what+" could not be released; it stays taken until it expires",
			"key", full, "backend", g.backend, "error", err)
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
// returns which bound ended an acquisition that found the lock held, and
// when a grant was answered (see heldInTime; zero when the clock was not
// read).
//
// A lease granted too late to be held (see heldInTime) is given back. A
// waiting acquisition then waits for that, within its bound, and goes on
// waiting for a lease it can hold: the backend stalled while the
// acquisition waited for its answer, or a database statement waited for a
// row lock another transaction held past the TTL. A single attempt fails
// with ErrUnavailable: the answer it got is no lock.
func (g *Guard) acquireBounded(ctx context.Context, full string, c *lockConfig) (driver.Lease, boundKind, time.Time, error) {
	ctxEnd, hasEnd := ctx.Deadline()
	lease, started, done, err := g.fastAttempt(ctx, full, c, ctxEnd, hasEnd)
	// The bounds count from a fast attempt's start, if one was made; a
	// zero end is none: nothing bounds the acquisition but ctx's
	// cancellation, if even that.
	var now, end time.Time
	kind := boundNone
	if c.wait >= 0 || hasEnd {
		if now = started; now.IsZero() {
			now = time.Now()
		}
		end = now.Add(g.callTimeout)
		if c.wait > 0 {
			end, kind = now.Add(c.wait), boundWait
		}
		if hasEnd && (c.wait < 0 || !ctxEnd.After(end)) {
			end, kind = ctxEnd, boundContext
		}
	}
	bound := boundNone
	// The pause before each wait after the first that followed a late
	// grant: a backend that grants at once what has already run out (a
	// TTL below its clock's step) would otherwise be asked again and again
	// as fast as it answers. The first comes at once: the row lock or the
	// stall that made the grant late is most likely over.
	var pause driver.Backoff
	for late := 0; ; late++ {
		// The fast attempt's answer, if it gave one, is the first.
		if !done {
			if end.IsZero() {
				lease, err = g.attempt(ctx, full, c, true, g.direct || ctx.Done() == nil)
			} else {
				lease, bound, err = g.acquireUntil(ctx, full, c, now, end, kind)
			}
		}
		done = false
		if err != nil {
			return lease, bound, time.Time{}, err
		}
		at, held := g.heldInTime(lease, c)
		if held {
			return lease, bound, at, nil
		}
		if c.wait == 0 {
			g.lateGrant(ctx, full, lease, at, late, "fails: a single attempt")
			go g.giveBack(full, lease, "a lease granted too late to be held")
			return nil, boundNone, time.Time{}, errGrantedTooLate(lease)
		}
		g.giveBackWithin(ctx, full, lease, end)
		if late > 0 && ctx.Err() == nil {
			d := pause.Next()
			if !end.IsZero() {
				d = min(d, time.Until(end))
			}
			_ = driver.Sleep(ctx, d, nil)
		}
		if ctx.Err() != nil {
			g.lateGrant(ctx, full, lease, at, late, "ends: its context is done")
			// Guard.acquire answers ctx's error, with this as its cause.
			return nil, boundNone, time.Time{}, errGrantedTooLate(lease)
		}
		if now = time.Now(); !end.IsZero() && !now.Before(end) {
			g.lateGrant(ctx, full, lease, at, late, "ends: its bound has run out")
			return nil, boundNone, now, errGrantedTooLate(lease)
		}
		g.lateGrant(ctx, full, lease, at, late, "waits again")
	}
}

// lateGrant logs a lease granted too late to be held (answered at
// answered), given back, and what the acquisition then does: the first of
// an acquisition's at Warn, the others at Debug, so that a backend whose
// every grant comes late (a TTL below its clock's step) does not fill the
// log with each of its waiters' attempts.
func (g *Guard) lateGrant(ctx context.Context, full string, lease driver.Lease, answered time.Time, before int, then string) {
	level := slog.LevelWarn
	if before > 0 {
		level = slog.LevelDebug
	}
	g.logger.Log(ctx, level, "warden: a lease was granted too late to be held, and is given back; the acquisition "+then,
		"key", full, "backend", g.backend, "expiry", lease.Expiry(), "answered", answered, "late_grants", before+1)
}

// acquireUntil is the part of acquireBounded that waits, from now until
// end, the bound of the given kind.
func (g *Guard) acquireUntil(ctx context.Context, full string, c *lockConfig, now, end time.Time, kind boundKind) (driver.Lease, boundKind, error) {
	inline := g.inline(ctx)
	var unreached *driver.UnreachedError
	if c.wait != 0 {
		if probeAt := end.Add(-probeShare(end.Sub(now))); probeAt.After(now) {
			wctx, cancel := context.WithDeadline(ctx, probeAt)
			lease, err := g.attempt(wctx, full, c, true, inline)
			cancel()
			if err == nil || ctx.Err() != nil || wctx.Err() == nil {
				return lease, boundNone, err
			}
			// The wait's attempts failed (see driver.Unreached): if the
			// last attempt is not answered either, that failure says more
			// than the silence.
			errors.As(err, &unreached)
			if !time.Now().Before(end) {
				// No time is left for the last attempt (a late wake-up on
				// a busy machine): only a call that never answered, or
				// attempts that failed, show the backend out of reach;
				// otherwise the wait ran out.
				switch {
				case unreached != nil:
					err = noAnswerAfter(unreached)
				case err != errNoAnswer:
					err = ErrNotAcquired
				}
				return nil, kind, err
			}
		}
	}
	pctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	lease, err := g.attempt(pctx, full, c, false, inline)
	err = noAnswer(ctx, pctx, err)
	if c.wait == 0 {
		// A single attempt's ErrNotAcquired is its answer, whatever bound
		// it had.
		return lease, boundNone, err
	}
	if errors.Is(err, ErrNotAcquired) && time.Now().Before(end) {
		// The backend answers and the lock is held: wait out what is
		// left of the bound, so that a release in it is not missed. A
		// failure of that wait leaves the answer as it was.
		lease, werr := g.attempt(pctx, full, c, true, inline)
		if werr == nil || ctx.Err() != nil || (errors.Is(werr, ErrUnavailable) && werr != errNoAnswer && !errors.As(werr, new(*driver.UnreachedError))) {
			return lease, boundNone, werr
		}
	}
	if err == errNoAnswer && unreached != nil {
		err = noAnswerAfter(unreached)
	}
	return lease, kind, err
}

// noAnswerAfter is errNoAnswer for a bounded wait whose attempts had
// failed (u) before its last attempt went unanswered: that failure may
// tell the caller what to mend (a refused connection, a wrong password,
// an address nothing listens on), where the silence alone does not.
func noAnswerAfter(u *driver.UnreachedError) error { return &noAnswerAfterError{last: u.Last} }

type noAnswerAfterError struct{ last error }

// Error says ErrUnavailable's words once, though both errors carry them.
func (e *noAnswerAfterError) Error() string {
	return errNoAnswer.Error() + "; before it, " + strings.TrimPrefix(e.last.Error(), ErrUnavailable.Error()+": ")
}

func (e *noAnswerAfterError) Unwrap() []error { return []error{errNoAnswer, e.last} }

// heldInTime reports whether lease, just granted, came in time to be held,
// and when its answer came (the clock read here, once per acquisition, is
// also the one that times it): not when it runs out within the loss margin
// of now, its TTL counted from the request's sending, whose answer came
// that late. Another may hold such a lease by now, and work started on it
// would run beside theirs until the keeper noticed. A lease on a session
// lives as long as its session, which is kept alive apart from the grant:
// its expiry is the session's, and the clock is not read for it. Neither
// is it for no lease, which the caller refuses.
func (g *Guard) heldInTime(lease driver.Lease, c *lockConfig) (time.Time, bool) {
	if lease == nil {
		return time.Time{}, true
	}
	if _, ok := lease.(driver.SessionLease); ok {
		return time.Time{}, true
	}
	now := time.Now()
	return now, now.Add(g.marginFor(c.ttl)).Before(lease.Expiry())
}

// giveBackWithin gives lease back (see giveBack), and waits for that until
// end (none when zero) or ctx's end: so that an acquisition waiting again
// finds the lock free, rather than held by its own lease.
func (g *Guard) giveBackWithin(ctx context.Context, full string, lease driver.Lease, end time.Time) {
	given := make(chan struct{})
	go func() {
		defer close(given)
		g.giveBack(full, lease, "a lease granted too late to be held")
	}()
	var ended <-chan time.Time
	if !end.IsZero() {
		t := time.NewTimer(time.Until(end))
		defer t.Stop()
		ended = t.C
	}
	select {
	case <-given:
	case <-ctx.Done():
	case <-ended:
	}
}

// errGrantedTooLate is the failure of an acquisition whose lease was
// granted too late to be held (see heldInTime), and given back.
func errGrantedTooLate(lease driver.Lease) error {
	return fmt.Errorf("%w: the lease was granted too late to be held: it ends at %v, too soon after the answer came to be renewed", ErrUnavailable, lease.Expiry().Round(0))
}

// fastBound bounds a fast attempt (see fastAttempt): a cancellation of the
// caller's context while it runs is honoured within it, well within
// handoff.Grace, as on a call goroutine.
const fastBound = handoff.Grace / 2

// fastPause is how long a Guard makes no fast attempt after one that found
// the lock held or failed, and after the first of those in a row that got
// no answer within fastBound; each such attempt after it doubles the
// pause, up to fastPause<<maxFastDoublings (about 8.5 minutes).
const fastPause = time.Second

const maxFastDoublings = 9

// fastAttempt starts a waiting acquisition with one attempt that does not
// wait, made on the caller's goroutine and bounded by fastBound, when the
// backend returns once its context's deadline has passed but not once it
// is cancelled (driver.DeadlineBounded: redislock) and ctx can be
// cancelled, which would otherwise hand the whole acquisition to a call
// goroutine. Most acquisitions find their lock free, and the hand-off to
// another goroutine and back wakes a thread each way on a machine with
// idle CPUs: about 35µs of a 150µs cycle on loopback Redis, measured
// (4-8µs at GOMAXPROCS=1).
//
// It reports done with the lease it got, or when ctx has ended, and when
// it made the attempt (zero if it made none), from which the acquisition's
// bounds count. Otherwise the acquisition goes on as if the attempt had
// not been made: a lease its attempt may have taken unanswered the
// backend gives back itself, as it does for any attempt that failed. And
// the Guard makes no fast attempt for fastPause, so that a Guard whose
// locks are contended does not pay a round trip more on each acquisition;
// nor, for twice as long after each unanswered fast attempt in a row, one
// whose backend answers slower than fastBound (a distant server): each
// such attempt costs the time of its bound and the backend's cleanup of
// what it may have taken (redislock's runs four times over 5s), and a
// Guard that locks once a minute, as a cron job's does, would otherwise
// pay them on every acquisition. An attempt answered in time ends the
// doubling. A single attempt (NoWait) makes none: a lease taken by an
// unanswered fast attempt, not yet given back, would make the one attempt
// that follows find its own lock held. Nor does a fair one, which would
// try the lock before taking its place in the queue; nor a read or write
// lock or a semaphore, whose attempt would pass this process's own waiters
// (a backend's release hands a plain lock to a waiter, not those); nor one
// whose wait bound, or ctx's deadline, is closer than fastBound.
//
// An attempt that got no answer may still reach the server after the
// backend gave back what it might have taken, and take the lock for nobody
// then: redislock gives it back again a while later (see its cleanUp), so
// that a request held up on the network (a lost segment sent again) costs
// the lock's other contenders that while, not the lease's TTL.
func (g *Guard) fastAttempt(ctx context.Context, full string, c *lockConfig, end time.Time, hasEnd bool) (lease driver.Lease, started time.Time, done bool, err error) {
	if !g.byDeadline || g.direct || c.wait == 0 || c.fair || c.mode != exclusive || ctx.Done() == nil || (c.wait > 0 && c.wait < fastBound) {
		return nil, time.Time{}, false, nil
	}
	now := time.Now()
	// On the monotonic clock: a wall clock stepped back would stretch the
	// pause by the step.
	since := int64(now.Sub(g.epoch))
	off := g.fastOff.Load()
	if since < off {
		return nil, now, false, nil
	}
	bound := now.Add(fastBound)
	if hasEnd && end.Before(bound) {
		return nil, now, false, nil
	}
	fctx, cancel := context.WithDeadline(ctx, bound)
	lease, err = g.acquireLease(fctx, full, c, false)
	// Past its bound: not fctx.Err(), which the deadline's timer sets
	// maybe a moment after the backend's own deadline ended the call.
	timedOut := !time.Now().Before(bound)
	cancel()
	if err == nil || ctx.Err() != nil {
		if err == nil {
			g.answeredInTime()
		}
		return lease, now, true, err
	}
	pause, missed := fastPause, false
	switch {
	case errors.Is(err, ErrNotAcquired):
		g.answeredInTime()
	case timedOut:
		missed = true
		pause <<= min(g.fastMisses.Load(), maxFastDoublings)
	}
	// The attempts made in one window count as one: only the first to end
	// sets the next pause, and counts its miss, so that a moment's slowness
	// seen by many acquisitions at once doubles the pause once, not once
	// for each of them.
	if g.fastOff.CompareAndSwap(off, int64(time.Since(g.epoch)+pause)) && missed {
		g.fastMisses.Store(min(g.fastMisses.Load()+1, maxFastDoublings))
	}
	return nil, now, false, nil
}

// answeredInTime ends the doubling of the pause between fast attempts (see
// fastAttempt); read first, so that the acquisitions of a Guard on many
// CPUs do not write the same memory every time.
func (g *Guard) answeredInTime() {
	if g.fastMisses.Load() != 0 {
		g.fastMisses.Store(0)
	}
}

// attempt calls the backend for c (one attempt, or a wait), on the caller's
// goroutine when inline, and otherwise through call. The watched path
// copies c into its call, so that the uncontended path of a backend that
// honours its context allocates nothing for it.
func (g *Guard) attempt(ctx context.Context, full string, c *lockConfig, wait, inline bool) (driver.Lease, error) {
	if inline {
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

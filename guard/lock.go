package guard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/internal/handoff"
)

// Lock is a held lock: a backend lease kept alive by the Guard's lease
// keeper, with a context that is cancelled, with cause ErrLockLost, as soon
// as the lease is known lost or could be.
//
// A Lock is safe for concurrent use. The same Lock is returned to nested
// acquisitions of its key made with its context (reentrancy), and the lease is
// released when the last of them unlocks.
type Lock struct {
	g     *Guard
	key   string // as the caller named it, without the Guard's prefix
	ttl   time.Duration
	lease driver.Lease

	// The lock's context (lockContext, a view of the Lock), guarded by
	// mu: the context it was taken with (its parent) until the section
	// first uses it, then the cancellable one made from it, whose values
	// and deadline are the parent's; cancel is set when that is made. One
	// field for both costs a held Lock 16 bytes less (a size class).
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	lostErr *lockError // set once, when the lease is lost
	section *section   // when traced

	// Lease keeper state, guarded by the keeper's mutex. Times are
	// nanoseconds from the keeper's base (keeper.nanos), which a held
	// Lock's size (one allocation per acquisition, and the heap per held
	// lock) favours over time.Time's 24 bytes.
	expiry  int64 // conservative expiry: the lock is lost a margin before it
	granted int64 // the grant: the first expiry less the TTL
	next    *Lock // below it on the keeper's young stack

	// The release's context (releaseContext, a view of the Lock), guarded
	// by mu: Unlock's ctx, set before the release starts (without its
	// cancellation once the bound is made), and the bound, made when a
	// backend or guard's watch first asks for it, and ended by finish.
	rel      context.Context
	relBound *releaseBound

	// Small fields last, packed.
	index      int32        // position in the keeper's heap, or in its session's locks; -1 when in neither
	state      atomic.Int32 // lockOut, lockYoung, lockKept or lockSession
	holds      int32        // guarded by mu
	depth      uint8        // its depth on the keeper's young stack, from 1 at the bottom, at most maxYoung
	refreshing bool         // a renewal is in flight; guarded by the keeper's mutex
	releasing  bool         // the release is under way and its bound may start; guarded by mu
	mode       mode
}

// outer is the innermost lock already held by the context l was taken
// with: its context carries it (its values are its parent's).
func (l *Lock) outer() *Lock { return heldBy(l.currentContext()) }

// currentContext is the lock's context as far as it has been made: its parent,
// or the cancellable context made from it.
func (l *Lock) currentContext() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctx
}

// section is what a traced Lock adds: the span of its critical section.
// Kept apart because a Lock is allocated on every acquisition, and its size
// decides how often an uncontended Do pays for a garbage collection.
type section struct {
	span  trace.Span
	since time.Time
}

// Key returns the key as it was passed to Lock (without the Guard's prefix),
// or "" on a nil *Lock.
func (l *Lock) Key() string {
	if l == nil {
		return ""
	}
	return l.key
}

// Token returns the lease's fencing token. It is greater than the token of
// every earlier holder of the key, so storage guarded by the lock can reject a
// write that carries an older token: see the fencing helpers of the backends.
// A nil *Lock's token is 0, which every fence refuses.
func (l *Lock) Token() uint64 {
	if l == nil {
		return 0
	}
	return l.lease.Token()
}

// Expiry returns the lease's conservative expiry as last confirmed: the send
// time of the request that granted or last renewed it plus its TTL, on this
// process's clock. The lock is declared lost a safety margin before it
// unless a renewal moves it. A nil *Lock's is the zero time.
func (l *Lock) Expiry() time.Time {
	if l == nil {
		return time.Time{}
	}
	k := &l.g.keeper
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.state.Load() == lockSession {
		return l.lease.(driver.SessionLease).Session().Expiry()
	}
	if l.expiry == 0 {
		// A session's lock, off its session (unlocked or lost), has no
		// expiry of its own.
		return time.Time{}
	}
	return k.time(l.expiry)
}

// Context returns a context derived from the one the lock was taken with,
// carrying the lock (nested acquisitions of the same key with it are
// reentrant) and cancelled when the lock is lost, with cause ErrLockLost
// (context.Cause), or when it is unlocked.
//
// A nil *Lock (what a failed Lock returns) guards nothing: its context is
// already cancelled, with a cause wrapping ErrNotHeld, so that work started
// on it despite the error stops rather than run unguarded.
func (l *Lock) Context() context.Context {
	if l == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errNotHeld(""))
		return ctx
	}
	return (*lockContext)(l)
}

// Err returns nil while the lock is held, an error wrapping ErrLockLost once
// the lock has been lost, and an error wrapping ErrNotHeld after Unlock, or
// on a nil *Lock (what a failed Lock returns), which holds nothing.
func (l *Lock) Err() error {
	if l == nil {
		return errNotHeld("")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr != nil {
		return l.lostErr
	}
	if l.holds == 0 {
		return errNotHeld(l.key)
	}
	return nil
}

func errNotHeld(key string) error {
	return &lockError{key: key, sentinel: ErrNotHeld, cause: errUnlocked}
}

// Unlock gives up one hold of the lock. The lease is released when the
// outermost holder unlocks, on a context detached from ctx and bounded by the
// Guard's release timeout, so that an already cancelled ctx still unlocks.
//
// Unlocking an unlocked Lock returns nil, and so does unlocking a nil *Lock
// (what a failed Lock returns), so that an Unlock deferred before the error
// check releases nothing rather than panic. When the lock had been lost, or
// the release finds the lease no longer this owner's (it expired, and may
// have been taken over), Unlock returns an error wrapping ErrLockLost (and
// ErrNotHeld).
func (l *Lock) Unlock(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	if l.holds == 0 {
		l.mu.Unlock()
		return nil
	}
	l.holds--
	if l.holds > 0 {
		l.mu.Unlock()
		return nil
	}
	var lost error
	if l.lostErr != nil {
		lost = l.lostErr
	}
	l.rel, l.releasing = ctx, true
	l.mu.Unlock()

	g := l.g
	g.keeper.remove(l)
	rctx := (*releaseContext)(l)
	var err error
	if g.direct || g.byDeadline {
		// The release context ends at its deadline, or when the release
		// is over: a backend bounded by either returns within the bound.
		err = l.lease.Release(rctx)
		if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && rctx.pastDeadline() {
			// Cut short at the release timeout: no answer within the
			// bound, as a release watched on a call goroutine reports it
			// when the grace past the bound brings no answer either.
			err = errNoAnswer
		}
	} else {
		// Bounded by the release timeout whatever the client does: a
		// release still running then goes on in the background. The
		// bound, which the watch needs now, carries the call: one
		// allocation for both.
		p := &rctx.bound().call
		p.Ctx, p.F, p.Arg = rctx, releaseOn, l.lease
		_, err = handoff.Wait(&g.callers, p)
	}

	switch {
	case lost != nil:
		err = lost
	case errors.Is(err, ErrNotHeld):
		// Another owner may have held the lock during the section: that is a
		// loss, even though nobody saw it before now.
		l.markLost(err, true)
		err = l.Err()
	case err != nil && g.keeper.overdue(l, time.Now()):
		// The release got no answer, and the section outlived the lease
		// while the keeper could not act (a paused process, a starved
		// timer): another owner may have held the lock meanwhile. (An
		// owner-checked release that succeeds proves nobody did, so only a
		// failed one needs the clock.)
		l.markLost(fmt.Errorf("the section ended after the lease's expiry less the %v margin, unrenewed, and the release failed: %w",
			g.marginFor(l.ttl), err), true)
		err = l.Err()
	case err != nil:
		// "May": a release that got no answer may have freed the lock, and
		// some backends go on releasing in the background (RedLock's
		// withdrawals from the nodes that did not answer in time).
		msg := "warden: release failed; the lock may stay taken until its lease expires on the server"
		if _, ok := l.lease.(driver.SessionLease); ok {
			// Such backends keep the key no longer than the session, which
			// they may go on releasing, or give up, in the background.
			msg = "warden: release failed; the lock may stay taken until the backend confirms the release or its session ends"
		}
		g.logger.WarnContext(ctx, msg, "key", l.key, "backend", g.backend, "ttl", l.ttl, "error", err)
		err = wrapLockErr(l.key, fmt.Errorf("release: %w", err))
	}
	l.finish()
	g.tel.held.Add(ctx, -1, g.tel.onBackend...)
	if g.tel.holdDuration.Enabled(ctx) {
		g.tel.holdDuration.Record(ctx, time.Since(g.keeper.time(l.granted)).Seconds(), g.tel.onRecord...)
	}
	if s := l.section; s != nil {
		outcome := "released"
		if errors.Is(err, ErrLockLost) {
			outcome = "lost"
		}
		endSpan(s.span, outcome, err, attribute.Int64("warden.held_ms", time.Since(s.since).Milliseconds()))
	}
	return err
}

// releaseOn releases lease, on a call goroutine.
func releaseOn(ctx context.Context, lease driver.Lease) (struct{}, error) {
	return struct{}{}, lease.Release(ctx)
}

// enter adds a reentrant hold, unless the lock has been lost or unlocked.
func (l *Lock) enter() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr != nil {
		return l.lostErr
	}
	if l.holds == 0 {
		return errNotHeld(l.key)
	}
	l.holds++
	return nil
}

// lose marks a held lock lost and cancels its context. Only the first cause
// is kept; a lock already unlocked is left alone.
func (l *Lock) lose(cause error) { l.markLost(cause, false) }

// revoked is the loss of a session lease the backend found removed by
// someone else (driver.RevocableLease), while the session lives.
func (l *Lock) revoked() {
	l.lose(fmt.Errorf("%w: the backend found the lease removed by someone else (a forced release)", ErrNotHeld))
}

// markLost is lose, and also for Unlock, when the release finds another
// owner after the last hold is gone (afterUnlock).
func (l *Lock) markLost(cause error, afterUnlock bool) {
	l.mu.Lock()
	if l.lostErr != nil || (l.holds == 0 && !afterUnlock) {
		l.mu.Unlock()
		return
	}
	l.lostErr = lostError(l.key, cause)
	err := l.lostErr
	l.mu.Unlock()

	// Record the loss before cancelling: the section may end, and its span
	// with it, as soon as its context is done.
	g := l.g
	if s := l.section; s != nil {
		s.span.AddEvent("warden.lock.lost", trace.WithAttributes(attribute.String("warden.cause", cause.Error())))
	}
	g.tel.lost.Add(context.Background(), 1, g.tel.byCause[l.lossKind(cause, afterUnlock)]...)
	msg := "warden: lock lost; its critical section's context is cancelled"
	switch {
	case afterUnlock && errors.Is(cause, ErrNotHeld):
		msg = "warden: lock lost; the release found it no longer this owner's"
	case afterUnlock:
		msg = "warden: lock lost; its section ended after its lease could have expired"
	}
	g.logger.Warn(msg, "key", l.key, "backend", g.backend, "token", l.lease.Token(), "error", cause)
	if !afterUnlock {
		g.keeper.remove(l)
	}
	l.end(err)
}

// lossKind names the cause of a loss for the warden.lock.lost metric.
func (l *Lock) lossKind(cause error, afterUnlock bool) string {
	_, session := l.lease.(driver.SessionLease)
	switch {
	case errors.Is(cause, ErrNotHeld):
		return causeTakenOver
	case afterUnlock:
		return causeOverdue
	case session:
		return causeSession
	}
	return causeExpired
}

// lockContext is the Lock's context, a view of the Lock: a
// context.WithCancelCause of the caller's context (parent), cancelled when
// the lock is lost or released, that also carries the Lock for reentrancy.
// The cancellable context is made the first time the section asks for it
// (Done, Err, a value), not when the lock is taken: a section that never
// looks, as most short ones do, costs neither its allocation nor its
// cancellation, which measured as a third of what guard adds to an
// uncontended Do on the memory backend. Being the Lock itself, it costs a
// held Lock no pointer back to it.
type lockContext Lock

// get returns the cancellable context, making it (already cancelled, if the
// lock has ended) on first use.
func (c *lockContext) get() context.Context {
	l := (*Lock)(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancel == nil {
		l.ctx, l.cancel = context.WithCancelCause(l.ctx)
		if cause := l.endedLocked(); cause != nil {
			l.cancel(cause)
		}
	}
	return l.ctx
}

// end cancels the lock's context with cause, if it has been made;
// otherwise get finds the cause in the lock's state when it makes it.
func (l *Lock) end(cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancel != nil {
		l.cancel(cause)
	}
}

// finish ends the release: its context, if its bound was made, is done
// from now on (a backend's work left running on it stops, and the bound
// leaves the Guard's release timer), and no other may start; and it
// cancels the lock's context, if it has been made, with the lock's own end
// cause: the loss, if one was declared meanwhile, stays the cause rather
// than the unlock. A context made later finds the same cause in get. (One
// hold of the mutex for both.)
func (l *Lock) finish() {
	l.mu.Lock()
	l.releasing = false
	b := l.relBound
	if l.cancel != nil {
		l.cancel(l.endedLocked())
	}
	l.mu.Unlock()
	if b != nil {
		// Without the mutex: it runs the cancellation of the contexts a
		// backend derived, which read the release context.
		l.g.releases.end(b, context.Canceled)
	}
}

// endedLocked is why the lock's context must be cancelled, or nil while it
// is held: the loss, else the unlock. Called with l.mu held.
func (l *Lock) endedLocked() error {
	if l.lostErr != nil {
		return l.lostErr
	}
	if l.holds == 0 {
		return errUnlocked
	}
	return nil
}

func (c *lockContext) Deadline() (time.Time, bool) { return (*Lock)(c).currentContext().Deadline() }
func (c *lockContext) Done() <-chan struct{}       { return c.get().Done() }
func (c *lockContext) Err() error                  { return c.get().Err() }
func (c *lockContext) String() string              { return "warden lock context" }

type holdKey struct{}

func (c *lockContext) Value(key any) any {
	if _, ok := key.(holdKey); ok {
		return (*Lock)(c)
	}
	// Through the cancellable context, which is how context.Cause finds it.
	return c.get().Value(key)
}

// heldBy returns the innermost lock carried by ctx, or nil.
func heldBy(ctx context.Context) *Lock {
	l, _ := ctx.Value(holdKey{}).(*Lock)
	return l
}

// releaseContext is the detached, bounded context a lease is released
// with, a view of the Lock. It carries the values of the caller's context
// but not its cancellation (nor, through context.Cause, its cause). Its
// bound (deadline, Done channel, its place in the Guard's release timer)
// is only made when a backend asks for it (Done, Deadline, Err, AfterFunc)
// or when guard bounds the release on a backend that does not declare
// driver.ContextBounded; the in-process backend does neither, so releasing
// there costs no clock read. It is done at its deadline, or when the
// release ends (finish), whichever comes first. A context a backend derives
// from it directly (context.WithCancel, WithTimeout, AfterFunc) hooks into
// it through its AfterFunc method, rather than start a goroutine to watch
// a Done channel the context package does not know; one derived through a
// context of another kind in between (a tracer's span context) still
// costs the context package that goroutine, until the bound ends.
type releaseContext Lock

// bound returns the release's bound, making it on first use: already done
// if the release is over.
func (c *releaseContext) bound() *releaseBound {
	l := (*Lock)(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.relBound == nil {
		timeout := l.g.releaseTimeout
		if !l.releasing {
			// Asked for after the release: report it over.
			timeout = 0
		}
		l.rel = valuesOnly(l.rel)
		l.relBound = l.g.releases.bound(timeout)
	}
	return l.relBound
}

func (c *releaseContext) Deadline() (time.Time, bool) { return c.bound().deadline, true }
func (c *releaseContext) Done() <-chan struct{}       { return c.bound().done }
func (c *releaseContext) Err() error                  { return c.bound().errNow() }
func (c *releaseContext) String() string              { return "warden release context" }

// pastDeadline reports whether the release's bound has passed, by the
// clock rather than by Err: the timer that ends the context may not have
// run yet when a backend that read the deadline gives up at it.
func (c *releaseContext) pastDeadline() bool { return !time.Now().Before(c.bound().deadline) }

// AfterFunc arranges for f to run once the release context is done, and
// is how the context package hooks a derived context into it.
func (c *releaseContext) AfterFunc(f func()) (stop func() bool) { return c.bound().afterFunc(f) }

// Value reads the caller's values without making the bound, and calls
// nothing of the caller's context but its Value; never its cancellation.
func (c *releaseContext) Value(key any) any {
	l := (*Lock)(c)
	l.mu.Lock()
	ctx, detached := l.rel, l.relBound != nil
	l.mu.Unlock()
	if !detached {
		ctx = valuesOnly(ctx)
	}
	return ctx.Value(key)
}

// valuesOnly is ctx without its cancellation: ctx itself when it is
// context.Background or TODO, which spares the detached context's
// allocation on every release made with one. It calls none of ctx's
// methods: it runs under the Lock's mutex, and ctx may be the lock's own
// context, or a context over it, whose methods take that mutex. Nor does
// it trust a context whose Done is nil to carry no cancellation: a
// hand-made detached context can still hand out its parent's cause
// through Value.
func valuesOnly(ctx context.Context) context.Context {
	if ctx == context.Background() || ctx == context.TODO() {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// releaseBound is the release context's deadline and end. It is not a
// context.WithTimeout of the caller's context, which cost six allocations
// per release a backend watches (the timer context, its timer and the
// timer's function, its cancel function, its Done channel, and the
// detached parent) and put a timer in and out of the runtime's timer heap
// on every release: it costs two (itself and its channel), and the
// detached parent only when the caller's context could be cancelled, and
// the Guard's one release timer (releaseTimer) ends it at its deadline.
type releaseBound struct {
	deadline time.Time
	done     chan struct{}

	mu  sync.Mutex
	err error // set when done is closed
	// AfterFunc's functions, until they are stopped or run, in room for
	// one kept in the bound: a client that derives one context at a time
	// (pgx, per query) grows no slice for it.
	after    []afterFunc
	afterBuf [1]afterFunc
	afterIDs uint64

	// Its place in the Guard's release timer's queue, guarded by the
	// timer's mutex.
	prev, next *releaseBound
	queued     bool

	// The release as a call on a kept goroutine (Unlock on a backend that
	// does not declare driver.ContextBounded).
	call handoff.Call[driver.Lease, struct{}]
}

// end closes done with err, unless it is closed already, and runs the
// functions AfterFunc was given.
func (b *releaseBound) end(err error) {
	b.mu.Lock()
	if b.err != nil {
		b.mu.Unlock()
		return
	}
	b.err = err
	close(b.done)
	after := b.after
	b.after = nil
	b.mu.Unlock()
	for _, a := range after {
		a.f()
	}
	// No function is added once b has ended: the one kept in the bound
	// (a derived context's cancel, holding what the context holds) is let
	// go rather than kept as long as the Lock.
	clear(b.afterBuf[:])
}

func (b *releaseBound) errNow() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// afterFunc is a function given to AfterFunc, and the id its stop
// function knows it by.
type afterFunc struct {
	id uint64
	f  func()
}

// afterFunc runs f when b ends, or at once on its own goroutine if it has
// (context.AfterFunc's contract); stop takes f back if it has not run.
func (b *releaseBound) afterFunc(f func()) (stop func() bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		go f()
		return func() bool { return false }
	}
	if b.after == nil {
		b.after = b.afterBuf[:0]
	}
	b.afterIDs++
	id := b.afterIDs
	b.after = append(b.after, afterFunc{id: id, f: f})
	return func() bool { return b.stop(id) }
}

// stop takes back the function AfterFunc was given as id, unless it has
// run.
func (b *releaseBound) stop(id uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(b.after, func(a afterFunc) bool { return a.id == id })
	if i < 0 {
		return false
	}
	b.after = slices.Delete(b.after, i, i+1)
	return true
}

// releaseTimer ends a Guard's release bounds at their deadlines, with one
// timer for all of them. Every bound is made with the Guard's release
// timeout, under the timer's mutex, so a queue in the order they are made
// is in the order of their deadlines: adding and removing one is a few
// pointer writes, and the timer, armed for the earliest, is left alone by
// later ones. In a loop of releases that end before their deadline, it is
// armed once per release timeout, not once per release.
type releaseTimer struct {
	mu         sync.Mutex
	head, tail *releaseBound
	timer      *time.Timer // made on the first bound
	armed      bool
}

// bound returns a bound timeout from now, queued for its deadline; one
// already ended if timeout is not positive.
func (rt *releaseTimer) bound(timeout time.Duration) *releaseBound {
	b := &releaseBound{done: make(chan struct{})}
	if timeout <= 0 {
		b.deadline = time.Now()
		b.end(context.DeadlineExceeded)
		return b
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	b.deadline = time.Now().Add(timeout)
	b.prev, b.queued = rt.tail, true
	if rt.tail != nil {
		rt.tail.next = b
	} else {
		rt.head = b
	}
	rt.tail = b
	if !rt.armed {
		rt.armLocked(timeout)
	}
	return b
}

func (rt *releaseTimer) armLocked(d time.Duration) {
	rt.armed = true
	if rt.timer == nil {
		rt.timer = time.AfterFunc(d, rt.fire)
	} else {
		rt.timer.Reset(d)
	}
}

// unlinkLocked takes b off the queue. Called with the mutex held.
func (rt *releaseTimer) unlinkLocked(b *releaseBound) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		rt.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		rt.tail = b.prev
	}
	b.prev, b.next, b.queued = nil, nil, false
}

// end ends b with err, the release being over, and takes it off the
// queue.
func (rt *releaseTimer) end(b *releaseBound, err error) {
	rt.mu.Lock()
	if b.queued {
		rt.unlinkLocked(b)
	}
	rt.mu.Unlock()
	b.end(err)
}

// fire ends the bounds whose deadline has come, and arms the timer for
// the next one, if any.
func (rt *releaseTimer) fire() {
	var due []*releaseBound
	rt.mu.Lock()
	rt.armed = false
	now := time.Now()
	for b := rt.head; b != nil && !now.Before(b.deadline); b = rt.head {
		rt.unlinkLocked(b)
		due = append(due, b)
	}
	if rt.head != nil {
		rt.armLocked(rt.head.deadline.Sub(now))
	}
	rt.mu.Unlock()
	for _, b := range due {
		b.end(context.DeadlineExceeded)
	}
}

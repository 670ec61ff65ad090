// Package guard runs critical sections under distributed locks.
//
// It has two layers, the way database/sql sits over its drivers. Backends
// (Redis, RedLock, etcd, ZooKeeper, Consul, SQL, in-process memory)
// implement the small contract of package guard/driver. Users call Guard, which owns the
// life of every lease for every backend alike:
//
//   - one lease keeper per Guard renews the held leases, many in one request
//     where the backend batches, and none at all where a backend session
//     renews them (etcd, ZooKeeper, Consul);
//   - loss on time: a lease not confirmed by a renewal is declared lost a
//     safety margin before it could expire on the server, on a timer, whatever
//     a renewal in flight is doing; the critical section's context is then
//     cancelled with cause ErrLockLost, and Do, DoAll and Unlock report it;
//   - reentrancy carried by the context, since Go has no thread identity;
//   - all-or-nothing multi-key locking in one fixed order;
//   - one key namespace (WithPrefix), validation of keys and TTLs against the
//     backend's limits, and sentinel errors for errors.Is;
//   - OpenTelemetry spans and metrics, and slog events.
//
// A fencing token comes with every lock (Lock.Token): pass it to the storage
// the lock protects, so a holder that was paused past its lease cannot
// overwrite the work of the next one.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/internal/handoff"
)

// Guard runs critical sections under the locks of one backend. It is safe
// for concurrent use; create one per backend and share it.
type Guard struct {
	locker         driver.Locker
	limits         driver.Limits
	prefix         string
	ttl            time.Duration
	margin         time.Duration
	releaseTimeout time.Duration
	callTimeout    time.Duration
	// direct: the backend returns once its ctx is done
	// (driver.ContextBounded), so guard calls it without a watch.
	direct bool
	// byDeadline: the backend returns once its ctx's deadline has passed
	// (driver.DeadlineBounded), so guard calls it without a watch when
	// only a deadline can end the call.
	byDeadline     bool
	backend        string
	owner          string
	logger         *slog.Logger
	tracerProvider trace.TracerProvider // nil: otel's global, read when used
	meterProvider  metric.MeterProvider
	tel            *telemetry
	keeper         keeper
	names          names
	callers        handoff.Callers
	releases       releaseTimer
	// fastOff is when, in nanoseconds since epoch (the Guard's making),
	// the Guard may make a fast attempt again (see fastAttempt).
	fastOff atomic.Int64
	// fastMisses counts the fast attempts in a row (those of one window
	// counting as one) that got no answer within their bound, up to
	// maxFastDoublings; each doubles the pause after it.
	fastMisses atomic.Int32
	epoch      time.Time
}

// New returns a Guard over locker, a backend's driver.Locker. It refuses
// options the backend cannot honour (a TTL outside its limits) with an error
// wrapping ErrInvalidOption.
func New(locker driver.Locker, opts ...Option) (*Guard, error) {
	if locker == nil {
		return nil, fmt.Errorf("warden: guard: %w: nil Locker", ErrInvalidOption)
	}
	c := config{
		prefix:         "warden:",
		ttl:            30 * time.Second,
		releaseTimeout: 5 * time.Second,
		callTimeout:    5 * time.Second,
		idleCallers:    16,
		backend:        fmt.Sprintf("%T", locker),
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	g := &Guard{
		locker:         locker,
		limits:         driver.LimitsOf(locker),
		prefix:         c.prefix,
		ttl:            c.ttl,
		margin:         c.margin,
		releaseTimeout: c.releaseTimeout,
		callTimeout:    c.callTimeout,
		backend:        c.backend,
		owner:          c.owner,
		logger:         c.logger,
		epoch:          time.Now(),
	}
	if cb, ok := locker.(driver.ContextBounded); ok {
		g.direct = cb.BoundedByContext()
	}
	if db, ok := locker.(driver.DeadlineBounded); ok {
		g.byDeadline = db.BoundedByDeadline()
	}
	if !c.ownerSet {
		g.owner = defaultOwner()
	}
	if err := driver.CheckOwner(g.owner); err != nil {
		return nil, fmt.Errorf("warden: guard: %w", err)
	}
	if err := g.ValidateTTL(c.ttl); err != nil {
		return nil, fmt.Errorf("warden: guard: %w", err)
	}
	if c.margin < 0 {
		return nil, fmt.Errorf("warden: guard: %w: safety margin %v is negative", ErrInvalidOption, c.margin)
	}
	if c.releaseTimeout <= 0 {
		return nil, fmt.Errorf("warden: guard: %w: release timeout %v is not positive", ErrInvalidOption, c.releaseTimeout)
	}
	if c.callTimeout <= 0 {
		return nil, fmt.Errorf("warden: guard: %w: call timeout %v is not positive", ErrInvalidOption, c.callTimeout)
	}
	if c.idleCallers < 0 {
		return nil, fmt.Errorf("warden: guard: %w: %d idle callers", ErrInvalidOption, c.idleCallers)
	}
	g.callers.Init(c.idleCallers, errNoAnswer)
	if c.prefix != "" {
		if err := ValidateKey(c.prefix); err != nil {
			return nil, fmt.Errorf("warden: guard: %w: prefix: %w", ErrInvalidOption, err)
		}
	}
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	if g.logger == nil {
		g.logger = slog.Default()
	}
	tel, err := newTelemetry(c.backend, c.tracerProvider, c.meterProvider)
	if err != nil {
		return nil, fmt.Errorf("warden: guard: telemetry: %w", err)
	}
	g.tel = tel
	g.tracerProvider, g.meterProvider = c.tracerProvider, c.meterProvider
	g.keeper.g, g.keeper.base = g, time.Now()
	return g, nil
}

// defaultOwner is "host/pid", cut to what a label may hold.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || driver.CheckOwner(host) != nil {
		host = "unknown-host"
	}
	pid := "/" + strconv.Itoa(os.Getpid())
	return host[:min(len(host), driver.MaxOwnerLen-len(pid))] + pid
}

// Backend returns the backend's name as spans, metrics and logs show it
// (WithBackendName).
func (g *Guard) Backend() string { return g.backend }

// Owner returns the label this Guard's leases carry (WithOwner).
func (g *Guard) Owner() string { return g.owner }

// TTL returns the Guard's default lease TTL.
func (g *Guard) TTL() time.Duration { return g.ttl }

// ReleaseTimeout returns how long a release on the way out of a section may
// take before the lease is left to expire.
func (g *Guard) ReleaseTimeout() time.Duration { return g.releaseTimeout }

// CallTimeout returns the bound of a call that neither its context's
// deadline nor a wait bound limits sooner (WithCallTimeout).
func (g *Guard) CallTimeout() time.Duration { return g.callTimeout }

// Logger returns the Guard's logger, for packages built on a Guard (the
// scheduler, the HTTP middleware) to log alike.
func (g *Guard) Logger() *slog.Logger { return g.logger }

// TracerProvider returns the TracerProvider the Guard traces with: the one
// given with WithTracerProvider, or otel's global one. Packages built on a
// Guard trace with it too.
func (g *Guard) TracerProvider() trace.TracerProvider {
	if g.tracerProvider != nil {
		return g.tracerProvider
	}
	return otel.GetTracerProvider()
}

// MeterProvider returns the MeterProvider the Guard measures with: the one
// given with WithMeterProvider, or otel's global one.
func (g *Guard) MeterProvider() metric.MeterProvider { return g.meterProvider }

// ValidateTTL reports why ttl cannot be used for a lock of this Guard: not
// positive, outside the backend's limits, or not longer than twice the
// safety margin. Packages that take a TTL from their users (the scheduler)
// call it when they are configured.
func (g *Guard) ValidateTTL(ttl time.Duration) error {
	if err := g.limits.CheckTTL(ttl); err != nil {
		return err
	}
	// ttl <= 2*margin, without doubling a margin that may be past half the
	// largest Duration.
	if g.margin > 0 && ttl-g.margin <= g.margin {
		return fmt.Errorf("%w: ttl %v is not longer than twice the safety margin %v", ErrInvalidOption, ttl, g.margin)
	}
	return nil
}

// ValidateLockOptions reports why opts cannot be used for a lock of this
// Guard (a TTL that ValidateTTL refuses, fewer than one permit), as Lock
// would at every call. Packages that take lock options from their users
// (httpmw's Lock) call it when they are configured.
func (g *Guard) ValidateLockOptions(opts ...LockOption) error {
	c := g.lockConfig(opts, false)
	return g.checkLockConfig(&c)
}

// checkLockConfig reports why c cannot be used for a lock of this Guard.
func (g *Guard) checkLockConfig(c *lockConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	if c.ttl != g.ttl {
		return g.ValidateTTL(c.ttl)
	}
	return nil
}

// marginFor is how long before a lease's conservative expiry its loss is
// declared.
func (g *Guard) marginFor(ttl time.Duration) time.Duration {
	if g.margin > 0 {
		return g.margin
	}
	return ttl / 10
}

// Lock acquires key, waiting while it is held elsewhere until it is free,
// ctx is done (ctx's error is returned), or the WaitAtMost bound runs out
// (ErrNotAcquired). The caller must Unlock the returned Lock.
//
// Lock returns within its bound (ctx's deadline or the wait bound, whichever
// comes first; for TryLock and NoWait, ctx's deadline or the call timeout)
// and a few tens of milliseconds, whatever the backend's client does with
// deadlines: a call that overruns is left to finish in the background, and
// a lease it turns out to have been granted is released there, so that
// nobody holds it. A backend that could not be reached within the bound is
// reported as ErrUnavailable, never as ErrNotAcquired: the last part of a
// bounded wait (a tenth, at most 250ms) goes to one attempt that does not
// wait, whose answer tells a held lock from an outage. When ctx ends first,
// the error is ctx's own, and it also matches ErrUnavailable when the
// backend had failed or not answered by then.
//
// A lease whose grant comes too late to be held (its TTL, counted from the
// request's sending, runs out within the loss margin of the answer: a
// server that stalled, a database statement that waited on a row lock
// another transaction held) is given back and logged (an acquisition's
// first at Warn, the others at Debug). Lock then waits again, within its
// bound, for one it can hold (a Fair waiter at the back of the queue),
// pausing before each wait after the first such; TryLock and NoWait fail
// with ErrUnavailable.
//
// When ctx already carries a held lock on key from this Guard (it is, or
// derives from, that Lock's Context), the same Lock is returned with one
// more hold: reentrancy.
func (g *Guard) Lock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	return g.acquire(ctx, key, g.lockConfig(opts, false))
}

// TryLock acquires key if it is free, and returns ErrNotAcquired at once if
// it is not.
func (g *Guard) TryLock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	return g.acquire(ctx, key, g.lockConfig(opts, true))
}

// lockConfig applies opts to the Guard's defaults. It returns a value, so
// that a call without options allocates nothing for its configuration.
func (g *Guard) lockConfig(opts []LockOption, try bool) lockConfig {
	c := lockConfig{ttl: g.ttl, wait: -1}
	if len(opts) > 0 {
		c = applyLockOptions(c, opts)
	}
	if try {
		c.wait = 0
	}
	return c
}

func applyLockOptions(c lockConfig, opts []LockOption) lockConfig {
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// Do runs fn while holding key, acquired as Lock does (waiting, unless
// NoWait or WaitAtMost say otherwise), and unlocks when fn returns or
// panics. fn's ctx is the Lock's context: it is cancelled, with cause
// ErrLockLost, if the lock is lost while fn runs.
//
// Do returns fn's error. If the lock was lost while fn ran, however that was
// learnt (a renewal that did not come in time, the backend's own signal, or
// the release finding another owner), the error wraps ErrLockLost, even when
// fn returned nil: the section may not have run alone to its end.
func (g *Guard) Do(ctx context.Context, key string, fn func(ctx context.Context, l *Lock) error, opts ...LockOption) error {
	if fn == nil {
		return wrapLockErr(key, fmt.Errorf("%w: nil function", ErrInvalidOption))
	}
	l, err := g.Lock(ctx, key, opts...)
	if err != nil {
		return err
	}
	return runLocked(ctx, func() error { return fn(l.Context(), l) }, l)
}

// DoAll runs fn while holding every key, all or nothing. Keys are taken in
// one fixed order (sorted, duplicates removed), so two callers locking
// overlapping sets cannot deadlock; if any key cannot be had, those already
// taken are released and the error is returned. Every key is checked
// (ValidateKey) before any is taken. fn's ctx is cancelled if any of the
// locks is lost; the locks are passed in key order. Like Do, DoAll reports
// a loss of any of them as an error wrapping ErrLockLost.
func (g *Guard) DoAll(ctx context.Context, keys []string, fn func(ctx context.Context, locks []*Lock) error, opts ...LockOption) error {
	if len(keys) == 0 {
		return fmt.Errorf("warden: %w: no keys", ErrInvalidKey)
	}
	if fn == nil {
		return fmt.Errorf("warden: %w: nil function", ErrInvalidOption)
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	// A key that cannot be taken is reported before any is: not after
	// waiting for the keys sorted before it.
	for _, k := range sorted {
		if err := ValidateKey(k); err != nil {
			return wrapLockErr(k, err)
		}
	}
	locks := make([]*Lock, 0, len(sorted))
	// Until every key is had, the keys taken are released on any way out
	// (an error, or a panic in a driver), each whatever another's Unlock
	// does, as runLocked releases them after.
	taken := false
	defer func() {
		if !taken {
			var lost error
			unlockAll(ctx, locks, &lost)
		}
	}()
	inner := ctx
	// One wait bound for the whole set: each key waits for what is left of
	// it, so that DoAll as a whole keeps the bound.
	var until time.Time
	if c := g.lockConfig(opts, false); c.wait > 0 {
		until = time.Now().Add(c.wait)
	}
	for _, k := range sorted {
		kopts := opts
		if !until.IsZero() {
			kopts = append(slices.Clip(opts), WaitAtMost(time.Until(until)))
		}
		// Each lock is taken with the previous one's context, so losing any
		// of them cancels the context fn gets.
		l, err := g.Lock(inner, k, kopts...)
		if err != nil {
			return err
		}
		locks = append(locks, l)
		inner = l.Context()
	}
	taken = true
	return runLocked(ctx, func() error { return fn(inner, locks) }, locks...)
}

// runLocked runs fn and unlocks locks (innermost first) on the way out, even
// if fn panics or calls runtime.Goexit, and folds a loss into the result.
// Nothing is recovered: Goexit (t.FailNow in a section) unwinds with nothing
// to recover, and a panic goes on up unchanged, with its stack.
func runLocked(ctx context.Context, fn func() error, locks ...*Lock) (err error) {
	defer func() {
		var lost error
		unlockAll(ctx, locks, &lost)
		err = withLoss(err, lost)
	}()
	return fn()
}

// unlockAll unlocks locks, the last first, each before it in a deferred
// call: a panic in one Unlock (a faulty driver) still lets every other run
// as it unwinds, rather than leaving them held and renewed. It keeps in
// *lost the first loss it meets.
func unlockAll(ctx context.Context, locks []*Lock, lost *error) {
	last := len(locks) - 1
	if last < 0 {
		return
	}
	if last > 0 {
		defer unlockAll(ctx, locks[:last], lost)
	}
	if err := locks[last].Unlock(ctx); errors.Is(err, ErrLockLost) && *lost == nil {
		*lost = err
	}
}

// withLoss is a section's result err once its locks are released, lost
// being the first loss among them.
func withLoss(err, lost error) error {
	switch {
	case lost == nil:
		return err
	case err == nil:
		return lost
	case errors.Is(err, ErrLockLost):
		// fn returned the cause of its cancelled context: the loss itself.
		return err
	}
	return fmt.Errorf("%w (%w)", err, lost)
}

func (g *Guard) acquire(ctx context.Context, key string, c lockConfig) (*Lock, error) {
	if ctx == nil {
		return nil, wrapLockErr(key, fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	full, err := g.names.full(g.prefix, key)
	if err != nil {
		return nil, wrapLockErr(key, err)
	}
	if err := g.checkLockConfig(&c); err != nil {
		return nil, wrapLockErr(key, err)
	}
	if l, err := g.reenter(ctx, key, &c); l != nil || err != nil {
		return l, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	var span trace.Span
	tracer := g.tel.tracerFor(ctx)
	if tracer != nil {
		_, span = g.tel.startSpan(ctx, tracer, "warden.acquire", key)
	}
	// The clock is read here only for someone who records the wait: on
	// some machines a clock read costs as much as the in-process lock
	// itself (the grant's check reads it once, see heldInTime).
	timed := span != nil || g.tel.acquireDuration.Enabled(ctx)
	var start time.Time
	if timed {
		start = time.Now()
	}
	// A waiting acquisition counts as a waiter for all of its time, its one
	// round trip included when the lock is free: only the backend knows
	// whether it queued, and asking would cost a request.
	waits := c.wait != 0 && g.tel.waiters.Enabled(ctx)
	if waits {
		g.tel.waiters.Add(ctx, 1, g.tel.onBackend...)
	}
	lease, bound, answered, err := g.acquireBounded(ctx, full, &c)
	if waits {
		g.tel.waiters.Add(ctx, -1, g.tel.onBackend...)
	}
	var took time.Duration
	if timed {
		if answered.IsZero() {
			answered = time.Now()
		}
		took = answered.Sub(start)
	}
	if err == nil && lease == nil {
		err = fmt.Errorf("%w: the backend returned neither a lease nor an error", ErrUnavailable)
	}
	if err != nil {
		// The backend's error is looked at before the bounds: a wait that
		// ran out while the backend could not be reached is an outage,
		// not contention.
		outcome := outcomeError
		switch {
		case ctx.Err() != nil:
			outcome, err = outcomeCanceled, cutShort(ctx, err)
		case errors.Is(err, ErrUnavailable):
			err = wrapLockErr(key, err)
		case bound == boundContext && errors.Is(err, ErrNotAcquired):
			// The last attempt, just before ctx's deadline, found the
			// lock held.
			outcome, err = outcomeCanceled, context.DeadlineExceeded
		case bound == boundWait && errors.Is(err, ErrNotAcquired):
			outcome, err = outcomeNotAcquired, &lockError{key: key, sentinel: ErrNotAcquired,
				cause: fmt.Errorf("still held after waiting %v", c.wait)}
		case errors.Is(err, ErrNotAcquired):
			outcome, err = outcomeNotAcquired, wrapLockErr(key, err)
		default:
			err = wrapLockErr(key, err)
		}
		g.tel.acquired(ctx, outcome, took)
		endSpan(span, outcome, nil, attribute.Int64("warden.waited_ms", took.Milliseconds()))
		return nil, err
	}

	l := &Lock{
		g: g, key: key, mode: c.mode, ttl: c.ttl,
		lease: lease, holds: 1, index: -1,
	}
	l.ctx = ctx
	if c.detach {
		l.ctx = context.WithoutCancel(ctx)
	}
	g.tel.acquired(ctx, outcomeAcquired, took)
	if span != nil {
		endSpan(span, outcomeAcquired, nil,
			attribute.Int64("warden.waited_ms", took.Milliseconds()),
			attribute.Int64("warden.token", int64(lease.Token())))
		if sctx, s := g.tel.startSpan(l.ctx, tracer, "warden.section", key); s != nil {
			s.SetAttributes(attribute.Int64("warden.token", int64(lease.Token())))
			l.section = &section{span: s, since: start.Add(took)}
			l.ctx = sctx
		}
	}
	g.keeper.add(l)
	return l, nil
}

// acquireLease makes the backend call for c: one attempt, or a wait.
func (g *Guard) acquireLease(ctx context.Context, full string, c *lockConfig, wait bool) (driver.Lease, error) {
	o := driver.AcquireOptions{TTL: c.ttl, Wait: wait, Fair: c.fair, Owner: g.owner}
	switch c.mode {
	case read, write:
		rw, ok := g.locker.(driver.RWLocker)
		if !ok {
			return nil, fmt.Errorf("%w: read/write locks on %s", ErrUnsupported, g.backend)
		}
		if c.mode == read {
			return rw.AcquireRead(ctx, full, o)
		}
		return rw.AcquireWrite(ctx, full, o)
	case semaphore:
		s, ok := g.locker.(driver.Semaphorer)
		if !ok {
			return nil, fmt.Errorf("%w: semaphores on %s", ErrUnsupported, g.backend)
		}
		return s.AcquireSemaphore(ctx, full, c.permits, o)
	}
	return g.locker.Acquire(ctx, full, o)
}

// reenter returns the lock ctx already holds on key, with one more hold, or
// nil when ctx holds none. Holding the write side satisfies a nested read;
// any other change of mode on a held key is refused, because waiting for it
// would deadlock on the caller's own hold.
func (g *Guard) reenter(ctx context.Context, key string, c *lockConfig) (*Lock, error) {
	for h := heldBy(ctx); h != nil; h = h.outer() {
		if h.g != g || h.key != key {
			continue
		}
		compatible := h.mode == c.mode || (h.mode == write && c.mode == read)
		if !compatible {
			return nil, wrapLockErr(h.key, fmt.Errorf("%w: already held by this context in %s mode; a nested %s lock would deadlock",
				ErrInvalidOption, h.mode, c.mode))
		}
		if err := h.enter(); err != nil {
			if errors.Is(err, ErrLockLost) {
				return nil, err
			}
			continue // an unlocked lock left in the context: acquire anew
		}
		g.tel.acquired(ctx, outcomeReentered, 0)
		return h, nil
	}
	return nil, nil
}

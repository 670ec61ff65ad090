package idempotency

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden/internal/handoff"
)

const instrumentation = "github.com/warden-go/warden/idempotency"

// finishTimeout bounds the completion of a call, all its attempts
// together (each is bounded by the call timeout as well), and any one
// release. They run on a context detached from the caller's, so that a
// caller that gave up the moment fn returned does not leave the claim
// hanging until its lease runs out.
const finishTimeout = 10 * time.Second

// giveBackTimeout bounds each request of a give-back (see giveBack), so
// that one lasts seconds, not minutes, against a store that does not
// answer.
const giveBackTimeout = time.Second

// ErrStoredFailure is wrapped by the error a replay returns when the first
// call's failure was stored under the Keep policy. The message of the
// original error follows it; the original error value itself is not kept.
var ErrStoredFailure = errors.New("warden/idempotency: stored failure replayed")

// Outcomes of a call, as recorded on spans and logs.
const (
	outcomeExecuted   = "executed"
	outcomeReplayed   = "replayed"
	outcomeInProgress = "in_progress"
	outcomeMismatch   = "fingerprint_mismatch"
	outcomeReleased   = "released"
	outcomeLost       = "lost"
	outcomeError      = "error"
	// outcomeNotReplayable: fn ran and its result could not be kept; the
	// key is done all the same, and its repeats get ErrNotReplayable.
	outcomeNotReplayable = "not_replayable"
)

// MaxResultLen is the largest result of fn that is stored for replay: the
// stores' MaxResponseLen less the two bytes the Executor puts before it. A
// larger result is recorded as executed, not replayable.
const MaxResultLen = MaxResponseLen - 2

// Func is the work Do runs at most once per key. Its bytes are the result
// stored for replay. ctx is cancelled when the caller's is, and with cause
// ErrNotOwner when the claim is lost or may be (no renewal was answered by a
// tenth of the lease before the claim could run out on the store, or
// another caller took over after it expired), since from then on a retry
// may be running the same work (WithDetachedRun keeps only the latter). A
// claim answered too late to leave that tenth is given back and fn does
// not run (ErrUnavailable). The claim itself outlives the caller's
// cancellation: it is renewed until fn returns.
//
// A Func whose work is done but whose result cannot be replayed (it was
// streamed, or handed to someone else) returns an error wrapping
// ErrNotReplayable, with bytes that sum the outcome up (at most
// MaxResultLen of them; more are dropped): the key is then completed as
// executed, not replayable, whatever the ErrorPolicy says, and repeats get
// those bytes and an error wrapping ErrNotReplayable instead of a run.
type Func func(ctx context.Context) ([]byte, error)

// Result is what Do returns: fn's bytes, either fresh or replayed.
type Result struct {
	Response []byte
	// Replayed is true when fn did not run in this call: the result is the
	// one an earlier call stored.
	Replayed bool
}

// Executor runs functions at most once per key over a Store: the first
// caller claims the key and runs fn, its result is stored and replayed to
// the callers that come after. It is safe for concurrent use; one Executor
// serves any number of keys.
type Executor struct {
	store Store
	// direct: the store returns once its ctx is done (ContextBounded), so
	// its calls are made on the caller's goroutine; otherwise on one of
	// calls'.
	direct bool
	// byDeadline: the store returns once its ctx's deadline has passed
	// (DeadlineBounded), so the calls only a deadline can end are made on
	// the caller's goroutine too.
	byDeadline bool
	calls      handoff.Callers
	cfg        config
	tracer     trace.Tracer
	// givingBack counts the give-backs running (see giveBack).
	givingBack atomic.Int32
	// finishing counts the completions going on in the background (see
	// finishLater).
	finishing atomic.Int32
}

// maxGivingBack bounds the give-backs an Executor runs at once: in an
// outage every failed Claim would start one, each sending a few requests
// to a store that answers none, and a claim made with no give-back left
// to spare waits out its lease as it did before give-backs.
const maxGivingBack = 64

// maxFinishing bounds the completions an Executor goes on with in the
// background at once (see finishLater), each holding its result: in an
// outage every call whose fn returned would start one.
const maxFinishing = 64

// New returns an Executor over store. It returns an error wrapping
// ErrInvalid, naming the input, when store or an option is nil or an
// option is out of range.
func New(store Store, opts ...Option) (*Executor, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalid)
	}
	cfg := config{
		lease:     DefaultLease,
		retention: DefaultRetention,
		call:      DefaultCallTimeout,
		idle:      DefaultIdleCallers,
		onError:   func(error) Action { return Release },
		logger:    slog.Default(),
		tracer:    otel.GetTracerProvider(),
		meter:     otel.GetMeterProvider(),
	}
	if err := cfg.apply(opts); err != nil {
		return nil, err
	}
	var err error
	if cfg.metrics, err = newStoreMetrics(cfg.meter); err != nil {
		return nil, err
	}
	cb, ok := store.(ContextBounded)
	e := &Executor{store: store, direct: ok && cb.BoundedByContext(), cfg: cfg, tracer: cfg.tracer.Tracer(instrumentation)}
	if db, ok := store.(DeadlineBounded); ok {
		e.byDeadline = db.BoundedByDeadline()
	}
	e.calls.Init(cfg.idle, errNoAnswer)
	return e, nil
}

// callers returns the goroutines e's store calls under ctx (or a context
// derived from it with a deadline) run on: none (nil) for a store that
// returns once its ctx is done, or once its deadline has passed when ctx
// has no cancellation of its own.
func (e *Executor) callers(ctx context.Context) *handoff.Callers {
	if e.direct || (e.byDeadline && ctx.Done() == nil) {
		return nil
	}
	return &e.calls
}

// Do runs fn once for (scope, key), scope set by WithScope:
//
//   - The first caller claims the key, runs fn while a watchdog renews the
//     claim every third of the lease, and stores fn's result for the
//     retention. It gets fn's result with Replayed false.
//   - A later caller with the same fingerprint gets the stored result with
//     Replayed true, without running fn.
//   - A caller with a different fingerprint gets ErrFingerprintMismatch.
//   - A caller that comes while the first is still running gets
//     ErrInProgress, or with WithWait waits for the first to finish.
//   - An error from fn releases the claim (the caller gets the error, and
//     the next call runs fn again) or is stored, as the ErrorPolicy says.
//   - A panic in fn releases the claim and goes on up the stack unchanged.
//   - A crashed owner's claim expires after its lease; then a retry runs fn.
//   - A result larger than MaxResultLen, or one too large for the store
//     (ErrTooLarge), or one fn says is not replayable (ErrNotReplayable),
//     completes the key as executed, not replayable: later callers get an
//     error wrapping ErrNotReplayable, never a second run.
//
// Once fn has been called, nothing but a panic or the ErrorPolicy frees
// the key for another run: not the caller's cancellation (the claim is
// renewed until fn returns, and the result stored on a context of its own),
// nor a result too large to keep. A store that fails when fn has returned
// is asked again, the caller waiting, for up to ten seconds, and then in
// the background (64 such at most) for as long as the claim may still be
// held: only a result not stored by the time the claim runs out lets a
// retry run fn again (logged at level ERROR). Nothing waits for those
// background completions: a process that exits meanwhile leaves the claim
// to run out, and a retry then runs fn again.
//
// When the claim was lost while fn ran, the result is not stored (a newer
// owner's record is never overwritten) and Do returns fn's bytes with an
// error wrapping ErrNotOwner. Errors reaching the store wrap ErrUnavailable.
//
// Do waits for the store no longer than its bounds, whatever the store's
// client does with its context (WithCallTimeout): a claim not answered
// within the call timeout (or ctx's deadline, when sooner) fails with
// ErrUnavailable, fn does not run, and the claim, should it land later,
// is given back; a renewal still waiting when fn returns delays Do by the
// call timeout at most, and fn is told a tenth of the lease before an
// unrenewed claim could run out whatever the renewal does; a completion
// not answered is treated as one that failed (fn's bytes returned with
// ErrUnavailable after ten seconds at most, the result perhaps stored in
// the background later).
// opts override the Executor's options for this call.
func (e *Executor) Do(ctx context.Context, key, fingerprint string, fn Func, opts ...Option) (Result, error) {
	if err := CheckContext(ctx); err != nil {
		return Result{}, err
	}
	cfg, tracer := &e.cfg, e.tracer
	if len(opts) > 0 {
		c := e.cfg
		if err := c.apply(opts); err != nil {
			return Result{}, err
		}
		if c.tracer != e.cfg.tracer {
			tracer = c.tracer.Tracer(instrumentation)
		}
		if c.meter != e.cfg.meter {
			m, err := newStoreMetrics(c.meter)
			if err != nil {
				return Result{}, err
			}
			c.metrics = m
		}
		cfg = &c
	}
	if err := CheckKey(cfg.scope, key); err != nil {
		return Result{}, err
	}
	if fn == nil {
		return Result{}, fmt.Errorf("%w: nil func", ErrInvalid)
	}
	hash := &keyHash{scope: cfg.scope, key: key}
	if !traced(ctx, tracer) {
		res, _, err := e.do(ctx, cfg, key, fingerprint, fn, hash)
		return res, err
	}
	ctx, span := tracer.Start(ctx, "warden.idempotency.Do", trace.WithAttributes(attribute.String("warden.idempotency.key_hash", hash.String())))
	defer span.End()
	res, outcome, err := e.do(ctx, cfg, key, fingerprint, fn, hash)
	span.SetAttributes(attribute.String("warden.idempotency.outcome", outcome))
	if outcome == outcomeError || outcome == outcomeLost {
		span.RecordError(err)
		span.SetStatus(codes.Error, outcome)
	}
	return res, err
}

// traced reports whether a span started with tracer under ctx could be
// recorded: false only for otel's global tracer while no program has set a
// global TracerProvider and ctx carries no recording span, where starting
// one costs allocations and records nothing.
func traced(ctx context.Context, tracer trace.Tracer) bool {
	if reflect.TypeOf(tracer) != unsetGlobalTracer {
		return true
	}
	if trace.SpanFromContext(ctx).IsRecording() {
		return true
	}
	return reflect.TypeOf(otel.GetTracerProvider()) != unsetGlobalTracerProvider
}

// The types of otel's global TracerProvider and its tracers before any
// program sets one: stand-ins that record nothing until then, and delegate
// afterwards.
var (
	unsetGlobalTracerProvider = reflect.TypeOf(otel.GetTracerProvider())
	unsetGlobalTracer         = reflect.TypeOf(otel.GetTracerProvider().Tracer(instrumentation))
)

// keyHash is KeyHash(scope, key), computed the first time a log, an error
// or a span needs it: most calls never do. The watchdog's renewal and its
// expiry may need it at once.
type keyHash struct {
	scope, key string
	once       sync.Once
	s          string
}

func (h *keyHash) String() string {
	h.once.Do(func() { h.s = KeyHash(h.scope, h.key) })
	return h.s
}

func (e *Executor) do(ctx context.Context, cfg *config, key, fingerprint string, fn Func, hash *keyHash) (Result, string, error) {
	c := Claim{Scope: cfg.scope, Key: key, Fingerprint: storedFingerprint(fingerprint), Owner: rand.Text(), Lease: cfg.lease}
	var deadline time.Time
	if cfg.wait > 0 {
		deadline = time.Now().Add(cfg.wait)
	}
	backoff := 5 * time.Millisecond
	for {
		sent := time.Now()
		live := ctx.Err() == nil
		rec, unanswered, err := bounded(ctx, e.callers(ctx), cfg.call, claimOn, storeCall{e: e, ctx: ctx, cfg: cfg, c: c, hash: hash}, lateClaim)
		cfg.metrics.record(ctx, opClaim, sent, err)
		switch {
		case err != nil:
			// A ctx already done sent nothing, and an invalid claim was
			// refused before it was made. A claim still unanswered is
			// given back once its answer comes (lateClaim).
			if live && !unanswered && !errors.Is(err, ErrInvalid) {
				if e.givingBack.Add(1) <= maxGivingBack {
					go e.giveBack(ctx, cfg, c, hash)
				} else {
					e.givingBack.Add(-1)
				}
			}
			return Result{}, outcomeError, storeError(ctx, "claim", err)
		case rec == nil, rec.State == StateInProgress && rec.Owner == c.Owner:
			// The second is this very claim: the client library sent it
			// again after its answer was lost (go-redis does, after its
			// read timeout), and the first one had been made.
			return e.run(ctx, cfg, c, sent, fn, hash)
		case rec.Fingerprint != c.Fingerprint && (len(fingerprint) <= MaxFingerprintLen || rec.Fingerprint != fingerprint):
			// A record of a release before long fingerprints were hashed
			// keeps such a one as it is: the same request, all the same.
			return Result{}, outcomeMismatch, fmt.Errorf("%w (key hash %s)", ErrFingerprintMismatch, hash)
		case rec.State == StateCompleted:
			res, err := decodeResult(rec.Response)
			switch {
			case errors.Is(err, ErrNotReplayable):
				return res, outcomeNotReplayable, fmt.Errorf("%w (key hash %s)", err, hash)
			case err != nil && !errors.Is(err, ErrStoredFailure):
				return Result{}, outcomeError, err
			}
			return res, outcomeReplayed, err
		}
		// In progress elsewhere. Waiting polls: the Store contract has no
		// notification, and a duplicate is rare enough that a few reads
		// with backoff cost less than a subscription per key.
		left := time.Until(deadline)
		if left <= 0 {
			return Result{}, outcomeInProgress, fmt.Errorf("%w (key hash %s)", ErrInProgress, hash)
		}
		t := time.NewTimer(min(backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return Result{}, outcomeError, context.Cause(ctx)
		case <-t.C:
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// hashedFingerprint begins every stored fingerprint that is a hash. A
// literal fingerprint that begins with it is hashed too, so no literal one
// is stored as a long one's hash: the stored forms of two different
// fingerprints differ unless SHA-256 collides.
const hashedFingerprint = "\x00sha256:"

// storedFingerprint is the fingerprint a claim carries: fingerprint itself,
// or its SHA-256 when it is longer than the stores keep (MaxFingerprintLen),
// as a caller's own fingerprint may be (the request body itself), so that
// it works on every store rather than fail on those whose requests cannot
// carry it.
func storedFingerprint(fingerprint string) string {
	if len(fingerprint) <= MaxFingerprintLen && !strings.HasPrefix(fingerprint, hashedFingerprint) {
		return fingerprint
	}
	sum := sha256.Sum256([]byte(fingerprint))
	return hashedFingerprint + hex.EncodeToString(sum[:])
}

// run executes fn under the claim c, sent to the store at sent, and ends
// the claim as the outcome says.
func (e *Executor) run(ctx context.Context, cfg *config, c Claim, sent time.Time, fn Func, hash *keyHash) (Result, string, error) {
	if time.Until(sent.Add(cfg.lease-leaseMargin(cfg.lease))) <= 0 {
		// The answer came so late that the claim may run out on the store
		// before fn could be told: another caller may claim the key as fn
		// starts.
		e.abandon(ctx, cfg, c, hash)
		return Result{}, outcomeError, fmt.Errorf("%w: claim: answered %v after it was sent, too late in its %v lease to run (key hash %s)",
			ErrUnavailable, time.Since(sent).Round(time.Millisecond), cfg.lease, hash)
	}
	base := ctx
	if cfg.detached {
		base = context.WithoutCancel(ctx)
	}
	runCtx, cancel := context.WithCancelCause(base)
	defer cancel(nil)
	stop := e.watch(runCtx, cancel, cfg, c, sent, hash)
	returned := false
	defer func() {
		// fn panicked or called runtime.Goexit: release the claim so a
		// retry can run, and let the panic go on with its own stack.
		if !returned {
			stop()
			e.abandon(ctx, cfg, c, hash)
		}
	}()
	out, fnErr := fn(runCtx)
	returned = true
	held := stop()
	res := Result{Response: out}

	notReplayable := errors.Is(fnErr, ErrNotReplayable)
	if fnErr != nil && !notReplayable && cfg.onError(fnErr) == Release {
		e.abandon(ctx, cfg, c, hash)
		return res, outcomeReleased, fnErr
	}
	var payload []byte
	if notReplayable {
		payload = encodeNotReplayable(out)
	} else {
		payload = encodeResult(out, fnErr)
	}
	outcome := outcomeExecuted
	if len(payload) > MaxResponseLen {
		cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency: result too large to replay; stored as executed, not replayable",
			slog.String("key_hash", hash.String()), slog.Int("bytes", len(payload)))
		payload, outcome = encodeNotReplayable(nil), outcomeNotReplayable
	}
	if notReplayable {
		outcome = outcomeNotReplayable
	}
	finishBy := time.Now().Add(finishTimeout)
	err := e.complete(ctx, cfg, c, payload, held, finishBy)
	if errors.Is(err, ErrTooLarge) {
		// The store keeps less than this record: the work is done all the
		// same, so the key is completed with the marker alone.
		cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency: result too large for the store; stored as executed, not replayable",
			slog.String("key_hash", hash.String()), slog.Int("bytes", len(payload)))
		outcome = outcomeNotReplayable
		payload = encodeNotReplayable(nil)
		err = e.complete(ctx, cfg, c, payload, held, finishBy)
	}
	if err != nil {
		if errors.Is(err, ErrNotOwner) {
			cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency: claim lost before completion; result not stored",
				slog.String("key_hash", hash.String()))
			return res, outcomeLost, errors.Join(fnErr, fmt.Errorf("idempotency: result not stored: %w", err))
		}
		// The store failed for as long as the claim could be held, or
		// finishTimeout, when the rest of the claim's life is left to
		// finishLater.
		msg := "idempotency: storing the result failed"
		if !errors.Is(err, ErrInvalid) && held.After(finishBy) && e.finishLater(ctx, cfg, c, payload, held, hash) {
			msg = "idempotency: storing the result failed; trying on in the background while the claim may be held"
		}
		cfg.logger.LogAttrs(ctx, slog.LevelError, msg, slog.String("key_hash", hash.String()), slog.Any("error", err))
		return res, outcomeError, errors.Join(fnErr, storeError(ctx, "complete", err))
	}
	return res, outcome, fnErr
}

// finishLater goes on storing payload as c's result in the background once
// the caller has stopped waiting (finishTimeout), until the claim can no
// longer be held (held): a store that comes back within the lease then
// gets the result, and the client's retry replays it, where the claim
// would otherwise have blocked the key until it ran out and a retry run fn
// a second time. It reports whether it started: at most maxFinishing run
// at once, and none once the claim's life is over.
func (e *Executor) finishLater(ctx context.Context, cfg *config, c Claim, payload []byte, held time.Time, hash *keyHash) bool {
	if !time.Now().Before(held) {
		return false
	}
	if e.finishing.Add(1) > maxFinishing {
		e.finishing.Add(-1)
		return false
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer e.finishing.Add(-1)
		if err := e.complete(ctx, cfg, c, payload, held, held); err != nil {
			// Said, since the caller was told only that the store failed
			// (it failed on, or the claim was found taken over): a retry
			// after the claim runs out runs fn again.
			cfg.logger.LogAttrs(ctx, slog.LevelError, "idempotency: result lost: not stored before the claim ran out",
				slog.String("key_hash", hash.String()), slog.Any("error", err))
		} else {
			cfg.logger.LogAttrs(ctx, slog.LevelInfo, "idempotency: stored the result in the background",
				slog.String("key_hash", hash.String()))
		}
	}()
	return true
}

// complete stores payload as c's result, on a context of its own, by
// finishBy.
//
// A store that fails is asked again, backing off, until finishBy or until
// the claim can no longer be held (held, the watch's bound on it): fn has
// run, and a result not stored leaves the claim to run out, after which the
// client's retry runs fn a second time. A few seconds of the caller's time
// are a small price for riding out a failover or a dropped connection at
// that moment. A request whose answer was lost may have completed the
// record all the same, and the next one is then refused (a completed record
// is final), as is one the client resent on its own (go-redis does, after a
// timeout): a refusal is checked against the record, read back, which says
// whether this owner completed it. Each request is bounded by the call
// timeout and finishBy, whichever comes first.
func (e *Executor) complete(ctx context.Context, cfg *config, c Claim, payload []byte, held, finishBy time.Time) error {
	call := storeCall{e: e, ctx: context.WithoutCancel(ctx), cfg: cfg, c: c, payload: payload}
	backoff := 20 * time.Millisecond
	for {
		start := time.Now()
		_, err := finishing(call, completeOn, finishBy)
		cfg.metrics.record(ctx, opComplete, start, err)
		switch {
		case err == nil, errors.Is(err, ErrTooLarge), errors.Is(err, ErrInvalid):
			return err
		case errors.Is(err, ErrNotOwner):
			start = time.Now()
			rec, gerr := finishing(call, getOn, finishBy)
			cfg.metrics.record(ctx, opGet, start, gerr)
			switch {
			case gerr == nil && rec.State == StateCompleted && rec.Owner == c.Owner:
				return nil
			case gerr == nil, errors.Is(gerr, ErrNotFound):
				return err
			}
			// Whether this owner completed it is unknown: asked again.
			err = gerr
		}
		if !time.Now().Add(backoff).Before(held) {
			return err
		}
		left := time.Until(finishBy)
		time.Sleep(min(backoff, left))
		if backoff >= left {
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// finishing makes s's request f, one of those that end a call, on s.ctx
// (detached from the caller's) bounded by the call timeout and finishBy,
// whichever comes first: one context for both bounds, as bounded then
// needs none of its own.
func finishing[T any](s storeCall, f func(context.Context, storeCall) (T, error), finishBy time.Time) (T, error) {
	end := time.Now().Add(s.cfg.call)
	if finishBy.Before(end) {
		end = finishBy
	}
	ctx, cancel := context.WithDeadline(s.ctx, end)
	defer cancel()
	v, abandoned, err := bounded(ctx, s.e.callers(s.ctx), s.cfg.call, f, s, nil)
	if abandoned && s.ctx.Err() == nil {
		// ctx's end is this call's own bound, not a caller's
		// cancellation: the store did not answer, and the log and the
		// caller's error must say so, not "context deadline exceeded".
		err = errNoAnswer
	}
	return v, err
}

// watch renews c every third of the lease until the returned stop is
// called, and cancels fn's context with cause ErrNotOwner once the claim is
// lost or can no longer be known to be held. It runs on a timer: a request
// whose handler returns within a third of the lease, as most do, costs no
// goroutine and no ticker, and stopping it waits for nothing but a renewal
// already in flight. stop returns the bound on the claim's life that the
// last renewal left.
func (e *Executor) watch(ctx context.Context, cancel context.CancelCauseFunc, cfg *config, c Claim, sent time.Time, hash *keyHash) (stop func() (held time.Time)) {
	w := &watchdog{e: e, ctx: ctx, cancel: cancel, cfg: cfg, c: c, hash: hash,
		interval: cfg.lease / 3, held: sent.Add(cfg.lease)}
	w.next = time.Now().Add(w.interval)
	w.mu.Lock()
	w.timer = time.AfterFunc(w.interval, w.renew)
	// The expiry is armed by the first renewal, so that a call that ends
	// before it costs no second timer, unless it is due before then (a
	// claim answered late).
	if d := time.Until(w.held.Add(-leaseMargin(cfg.lease))); d < w.interval {
		w.expiry = time.AfterFunc(d, w.expire)
	}
	w.mu.Unlock()
	if cw, ok := e.store.(ClaimWatcher); ok {
		w.quit = make(chan struct{})
		go w.follow(cw.ClaimDone(c.Scope, c.Key, c.Owner))
	}
	return w.stop
}

// leaseMargin is how long before the bound on a claim's life fn is told the
// claim may be gone, so that it stops before another caller can claim the
// key: a tenth of the lease, as guard's locks do.
func leaseMargin(lease time.Duration) time.Duration { return lease / 10 }

// watchdog is the state of one watch.
type watchdog struct {
	e        *Executor
	ctx      context.Context
	cancel   context.CancelCauseFunc
	cfg      *config
	c        Claim
	hash     *keyHash
	interval time.Duration

	mu    sync.Mutex
	timer *time.Timer
	// expiry fires a margin before held: renewals that fail or get no
	// answer must not leave fn running once the store may free the key.
	// nil until the first renewal (see watch).
	expiry *time.Timer
	// quit ends follow, for a ClaimWatcher's claims; nil for others.
	quit    chan struct{}
	stopped bool
	renewal chan struct{} // closed when the renewal in flight ends; nil when none is
	next    time.Time     // the tick the next renewal serves
	// held is a bound on the claim's life measured locally from before the
	// request that set it, so it never outlasts the store's.
	held time.Time
}

// stop ends the watch; once it returns, no renewal is in flight or to come.
// It returns the bound on the claim's life the last renewal left.
func (w *watchdog) stop() time.Time {
	w.mu.Lock()
	w.stopped = true
	w.timer.Stop()
	if w.expiry != nil {
		w.expiry.Stop()
	}
	if w.quit != nil {
		close(w.quit)
	}
	running := w.renewal
	w.mu.Unlock()
	if running != nil {
		<-running
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held
}

// expire runs a margin before the bound on the claim's life unless a
// renewal moved it: the renewals in between failed or are still waiting for
// an answer (a partition, a client that ignores its deadline), and the
// store may free the key at the bound, so fn is told now rather than when
// a renewal gives up.
func (w *watchdog) expire() {
	w.mu.Lock()
	stopped := w.stopped
	w.mu.Unlock()
	if stopped {
		return
	}
	w.cfg.logger.LogAttrs(w.ctx, slog.LevelWarn, "idempotency: claim not renewed in time; the work is told to stop",
		slog.String("key_hash", w.hash.String()))
	w.cancel(fmt.Errorf("%w: claim not renewed before it could run out", ErrNotOwner))
}

// follow tells fn its claim may be gone as soon as the store, a
// ClaimWatcher, closes done.
func (w *watchdog) follow(done <-chan struct{}) {
	select {
	case <-w.quit:
	case <-done:
		w.mu.Lock()
		stopped := w.stopped
		w.mu.Unlock()
		if !stopped {
			w.cfg.logger.LogAttrs(w.ctx, slog.LevelWarn, "idempotency: the store says the claim may be gone; the work is told to stop",
				slog.String("key_hash", w.hash.String()))
			w.cancel(fmt.Errorf("%w: the store may have lost the claim before its lease", ErrNotOwner))
		}
	}
}

// renew runs on the timer: one renewal, then the timer set for the next,
// one interval after the previous was due, as a ticker would.
func (w *watchdog) renew() {
	w.mu.Lock()
	if w.stopped || w.renewal != nil {
		w.mu.Unlock()
		return
	}
	running := make(chan struct{})
	w.renewal = running
	held := w.held
	w.next = w.next.Add(w.interval) // the tick after the one this serves
	if w.expiry == nil {
		w.expiry = time.AfterFunc(time.Until(held.Add(-leaseMargin(w.cfg.lease))), w.expire)
	}
	w.mu.Unlock()

	cfg := w.cfg
	sent := time.Now()
	// Renewals outlive the caller's cancellation: fn may still be finishing
	// work that must not be run twice. Each is bounded by the renewal
	// period as well as the call timeout, so that stop, which the caller
	// waits for, never waits longer for one in flight; the expiry timer
	// tells fn in time whatever the renewal in flight does.
	rctx := context.WithoutCancel(w.ctx)
	_, _, err := bounded(rctx, w.e.callers(rctx), min(w.interval, cfg.call), extendOn, storeCall{e: w.e, cfg: cfg, c: w.c}, nil)
	cfg.metrics.record(w.ctx, opExtend, sent, err)
	lost := false
	switch {
	case err == nil:
		held = sent.Add(cfg.lease)
	case errors.Is(err, ErrNotOwner):
		lost = true
	case time.Now().Before(held):
		cfg.logger.LogAttrs(w.ctx, slog.LevelWarn, "idempotency: renewing the claim failed; retrying",
			slog.String("key_hash", w.hash.String()), slog.Any("error", err))
	default:
		lost = true
	}
	if lost {
		cfg.logger.LogAttrs(w.ctx, slog.LevelWarn, "idempotency: claim lost while running",
			slog.String("key_hash", w.hash.String()), slog.Any("error", err))
		w.cancel(fmt.Errorf("%w: claim lost while running (%v)", ErrNotOwner, err))
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	w.held = held
	w.renewal = nil
	close(running)
	if w.stopped || lost {
		return
	}
	if err == nil {
		w.expiry.Reset(time.Until(held.Add(-leaseMargin(cfg.lease))))
	}
	// As a ticker does: a renewal that ran past the next tick is followed
	// at once by one more, and the ticks it ran past are dropped.
	now := time.Now()
	if w.next.After(now) {
		w.timer.Reset(w.next.Sub(now))
		return
	}
	for !w.next.Add(w.interval).After(now) {
		w.next = w.next.Add(w.interval)
	}
	w.timer.Reset(0)
}

// abandon releases c for the caller, who waits for it: bounded by the call
// timeout, after which the request goes on in the background.
func (e *Executor) abandon(ctx context.Context, cfg *config, c Claim, hash *keyHash) {
	start := time.Now()
	actx := context.WithoutCancel(ctx)
	_, _, err := bounded(actx, e.callers(actx), min(cfg.call, finishTimeout), abandonOn, storeCall{e: e, cfg: cfg, c: c}, nil)
	cfg.metrics.record(ctx, opAbandon, start, err)
	if err != nil && !errors.Is(err, ErrNotOwner) {
		// The claim then blocks the key until its lease runs out.
		cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idempotency: releasing the claim failed",
			slog.String("key_hash", hash.String()), slog.Any("error", err))
	}
}

// giveBack abandons c, whose Claim failed, in case the store made it all
// the same: the caller's ctx may have ended, or its answer been lost, after
// the request went, which a client that hangs up mid-claim does every
// time. Left alone, such a claim would hold the key in progress until its
// lease ran out (30 s by default), and every retry with the key would get
// ErrInProgress meanwhile. The claim may also land after the failed call
// has returned (a request still on its way, a statement still running), so
// Abandon is tried again a few times over some seconds, until one succeeds.
// Abandon is owner-checked and the owner is this call's own, so giving it
// back can free nobody else's claim; a claim that was never made costs a
// few ErrNotOwner answers, on the failure path only, and at most
// maxGivingBack run at once.
func (e *Executor) giveBack(ctx context.Context, cfg *config, c Claim, hash *keyHash) {
	defer e.givingBack.Add(-1)
	for _, pause := range [...]time.Duration{0, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second} {
		time.Sleep(pause)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
		start := time.Now()
		err := e.store.Abandon(actx, c.Scope, c.Key, c.Owner)
		cancel()
		cfg.metrics.record(ctx, opAbandon, start, err)
		if err == nil {
			cfg.logger.LogAttrs(ctx, slog.LevelInfo, "idempotency: gave back a claim whose answer was lost",
				slog.String("key_hash", hash.String()))
			return
		}
	}
}

// storeError makes err, from the store, wrap ErrUnavailable unless it is an
// argument error or the caller's own cancellation.
func storeError(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrInvalid):
		return fmt.Errorf("idempotency: %s: %w", op, err)
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// KeyHash returns a short, stable digest of (scope, key) for logs and spans,
// where the key itself (often a secret-like random token, sometimes
// personal data) must not appear.
func KeyHash(scope, key string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(scope)))])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// The stored result is versioned so that the encoding can change without
// misreading records written by an earlier release:
//
//	version 1: 0x01, kind (0 success, 1 failure, 2 executed but not
//	replayable), for a failure the message length as a uvarint and the
//	message, then fn's bytes (for kind 2, fn's summary of its outcome).
const (
	resultV1            = 1
	resultSuccess       = 0
	resultFailure       = 1
	resultNotReplayable = 2
)

// encodeNotReplayable marks the key executed, not replayable, keeping
// summary when it fits.
func encodeNotReplayable(summary []byte) []byte {
	if len(summary) > MaxResultLen {
		summary = nil
	}
	return append([]byte{resultV1, resultNotReplayable}, summary...)
}

func encodeResult(out []byte, fnErr error) []byte {
	if fnErr == nil {
		return append([]byte{resultV1, resultSuccess}, out...)
	}
	msg := fnErr.Error()
	b := make([]byte, 0, 2+binary.MaxVarintLen64+len(msg)+len(out))
	b = append(b, resultV1, resultFailure)
	b = binary.AppendUvarint(b, uint64(len(msg)))
	b = append(b, msg...)
	return append(b, out...)
}

func decodeResult(b []byte) (Result, error) {
	if len(b) < 2 || b[0] != resultV1 {
		return Result{}, fmt.Errorf("%w: stored result in an unknown encoding", ErrInvalid)
	}
	switch b[1] {
	case resultSuccess:
		return Result{Response: b[2:], Replayed: true}, nil
	case resultFailure:
		n, size := binary.Uvarint(b[2:])
		if size <= 0 || n > uint64(len(b)-2-size) {
			return Result{}, fmt.Errorf("%w: stored failure truncated", ErrInvalid)
		}
		msg := b[2+size : 2+size+int(n)]
		return Result{Response: b[2+size+int(n):], Replayed: true}, fmt.Errorf("%w: %s", ErrStoredFailure, msg)
	case resultNotReplayable:
		return Result{Response: b[2:], Replayed: true}, ErrNotReplayable
	}
	return Result{}, fmt.Errorf("%w: stored result of unknown kind %d", ErrInvalid, b[1])
}

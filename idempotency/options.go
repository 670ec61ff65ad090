package idempotency

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of an Executor.
const (
	// DefaultLease is how long a claim lives without renewal. While fn runs a
	// watchdog renews it every third of the lease, so it only runs out when
	// the owner is gone or cut off from the store.
	DefaultLease = 30 * time.Second
	// DefaultRetention is how long a completed result is kept for replay.
	DefaultRetention = 24 * time.Hour
	// DefaultCallTimeout bounds each call to the store, as guard's default
	// call timeout bounds each call to a lock backend.
	DefaultCallTimeout = 5 * time.Second
	// DefaultIdleCallers is how many goroutines an Executor keeps idle for
	// its next store calls (WithIdleCallers).
	DefaultIdleCallers = 16
	// MinDuration is the shortest lease, retention, call timeout or
	// (non-zero) wait an Executor accepts. A shorter one is a unit slip (WithLease(2) is two
	// nanoseconds), and a lease of microseconds would have the watchdog
	// call Extend in a tight loop: renewals run every third of the lease.
	MinDuration = time.Millisecond
)

// Option configures an Executor (in New) or a single call (in Do, where it
// overrides the Executor's setting for that call only).
type Option func(*config)

// Action is what an ErrorPolicy decides for an error returned by fn.
type Action int

const (
	// Release abandons the claim, so the next call with the key runs fn
	// again. The caller gets fn's error; nothing is stored.
	Release Action = iota
	// Keep stores the failure as the key's result: later calls with the key
	// get an error wrapping ErrStoredFailure with the message of fn's error,
	// and fn's bytes, without running fn.
	Keep
)

// ErrorPolicy decides what an error returned by fn does to the claim.
type ErrorPolicy func(err error) Action

type config struct {
	scope     string
	lease     time.Duration
	retention time.Duration
	wait      time.Duration
	call      time.Duration
	idle      int
	detached  bool
	onError   ErrorPolicy
	logger    *slog.Logger
	tracer    trace.TracerProvider
	meter     metric.MeterProvider
	// metrics are meter's instruments, made once per provider.
	metrics *storeMetrics
}

func (c *config) validate() error {
	switch {
	case c.lease < MinDuration:
		return fmt.Errorf("%w: WithLease %v is shorter than %v", ErrInvalid, c.lease, MinDuration)
	case c.retention < MinDuration:
		return fmt.Errorf("%w: WithRetention %v is shorter than %v", ErrInvalid, c.retention, MinDuration)
	case c.call < MinDuration:
		return fmt.Errorf("%w: WithCallTimeout %v is shorter than %v", ErrInvalid, c.call, MinDuration)
	case c.idle < 0:
		return fmt.Errorf("%w: WithIdleCallers %d is negative", ErrInvalid, c.idle)
	case c.wait != 0 && c.wait < MinDuration:
		return fmt.Errorf("%w: WithWait %v is neither 0 nor at least %v", ErrInvalid, c.wait, MinDuration)
	case len(c.scope) > MaxScopeLen:
		return fmt.Errorf("%w: WithScope of %d bytes, more than %d", ErrInvalid, len(c.scope), MaxScopeLen)
	case strings.HasPrefix(c.scope, ReservedScopePrefix):
		return fmt.Errorf("%w: WithScope %q begins with %q, which names warden's own scopes (a scheduler's slots): a principal scoped so could claim them", ErrInvalid, c.scope, ReservedScopePrefix)
	case c.onError == nil:
		return fmt.Errorf("%w: nil WithErrorPolicy", ErrInvalid)
	case c.logger == nil:
		return fmt.Errorf("%w: nil WithLogger", ErrInvalid)
	case c.tracer == nil:
		return fmt.Errorf("%w: nil WithTracerProvider", ErrInvalid)
	case c.meter == nil:
		return fmt.Errorf("%w: nil WithMeterProvider", ErrInvalid)
	}
	return nil
}

// apply applies opts to c, refusing a nil one.
func (c *config) apply(opts []Option) error {
	for i, o := range opts {
		if o == nil {
			return fmt.Errorf("%w: nil Option (argument %d)", ErrInvalid, i)
		}
		o(c)
	}
	return c.validate()
}

// WithScope sets the scope keys live in: typically the principal (the
// user, the tenant) so that one principal's key never reaches another's
// result, or the name of a consumer. Default "" (one shared scope). A
// scope beginning with ReservedScopePrefix is refused (ErrInvalid): map a
// principal whose name may take that form to another, as httpmw does by
// hashing it.
func WithScope(scope string) Option { return func(c *config) { c.scope = scope } }

// WithLease sets the in-progress lease (default DefaultLease, at least
// MinDuration): how long a crashed owner's claim blocks the key before a
// retry may run fn again.
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithRetention sets how long a completed result is replayed (default
// DefaultRetention, at least MinDuration). It is enforced by the store against the deadline it
// records, not left to an eviction TTL alone.
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithWait makes a duplicate that finds the key in progress wait up to d for
// the owner to finish, then replay its result (or, when the owner released
// the claim, run fn itself). Default 0: fail at once with ErrInProgress;
// any other d is at least MinDuration.
func WithWait(d time.Duration) Option { return func(c *config) { c.wait = d } }

// WithCallTimeout bounds each call to the store that its context's
// deadline does not bound sooner (default DefaultCallTimeout, at least
// MinDuration): the claim, the completion and its read-back, each renewal
// (also bounded by the renewal period, a third of the lease) and the
// release of a claim. A call the store has not answered within its bound is
// answered ErrUnavailable a few milliseconds later (20 at most past the
// bound, scheduling aside), whatever the store's client does: go-redis with
// its default options ignores deadlines and waits out its read timeout, and
// then sends the command again; pgx, or any client on a connection the
// network black-holes, may wait until TCP gives up; a hung Consul agent
// holds its HTTP request open. Without the bound, a caller whose context
// has no deadline (most HTTP requests) would wait as long. The call goes on
// in the background: a claim it makes after its caller stopped waiting is
// given back, owner-checked, and its work never runs. While 256 such calls
// are still running, the next fails at once with ErrUnavailable, so that a
// hung store does not cost a goroutine per request.
func WithCallTimeout(d time.Duration) Option { return func(c *config) { c.call = d } }

// WithIdleCallers sets how many goroutines the Executor keeps idle, each
// for up to a second, to make its calls to a store that does not declare
// ContextBounded (default DefaultIdleCallers, never negative): every call
// to such a store runs on a goroutine of the Executor's, so that it can be
// left behind at its bound (WithCallTimeout), and a goroutine kept for the
// next call spares it the growth of a new one's stack through the store's
// client, which costs more than the rest of the call. 0 keeps none, as an
// Executor used in a testing/synctest bubble needs: a goroutine left idle
// when the bubble's function returns fails its test. It is the Executor's
// setting: in Do it changes nothing.
func WithIdleCallers(n int) Option { return func(c *config) { c.idle = n } }

// WithDetachedRun makes fn's context independent of the caller's: it ends
// only when the claim is lost (cause ErrNotOwner), so that work whose caller
// gave up (a client that timed out) runs to its end and its result is
// stored, instead of being cut short halfway. Default: fn's context also
// ends with the caller's. The claim is renewed until fn returns either way.
func WithDetachedRun() Option { return func(c *config) { c.detached = true } }

// WithErrorPolicy sets what an error from fn does to the claim. Default:
// Release for every error, so a retry runs.
func WithErrorPolicy(p ErrorPolicy) Option { return func(c *config) { c.onError = p } }

// WithLogger sets the logger (default slog.Default()). Keys are logged only
// as hashes.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithTracerProvider sets where spans go (default otel.GetTracerProvider()).
// Keys appear on spans only as hashes.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracer = tp }
}

// WithMeterProvider sets where the warden.idempotency.store.duration metric
// goes (default otel.GetMeterProvider()).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meter = mp }
}

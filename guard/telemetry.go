package guard

import (
	"context"
	"reflect"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const instrumentation = "github.com/warden-go/warden/guard"

// Outcomes of an acquisition, as recorded on spans and metrics.
const (
	outcomeAcquired    = "acquired"
	outcomeReentered   = "reentered"
	outcomeNotAcquired = "not_acquired"
	outcomeCanceled    = "canceled"
	outcomeError       = "error"
)

// telemetry holds the instruments of one Guard. Measurement options are built
// once so that recording costs no allocation on the hot path.
type telemetry struct {
	// tracer is set when the Guard was given a TracerProvider; otherwise
	// spans use the provider of the recording parent span, if any.
	tracer trace.Tracer

	acquireDuration metric.Float64Histogram
	holdDuration    metric.Float64Histogram
	held            metric.Int64UpDownCounter
	waiters         metric.Int64UpDownCounter
	contended       metric.Int64Counter
	lost            metric.Int64Counter
	refreshFailures metric.Int64Counter
	renewalRequests metric.Int64Counter
	forceReleased   metric.Int64Counter

	backendAttr attribute.KeyValue
	// Option slices, not single options: a variadic call with a fresh slice
	// would allocate on every measurement.
	byOutcome map[string][]metric.RecordOption
	onBackend []metric.AddOption
	onRecord  []metric.RecordOption
	byCause   map[string][]metric.AddOption
	byResult  map[bool][]metric.AddOption // of a renewal request: ok or not
}

// Causes of a loss, as the warden.lock.lost metric labels them.
const (
	causeExpired   = "expired"    // not renewed before the conservative expiry less the margin
	causeTakenOver = "taken_over" // the backend found the lease another owner's, or gone
	causeSession   = "session"    // the backend session that kept it was lost
	causeOverdue   = "overdue"    // the section outlived the lease and its release failed
)

func newTelemetry(backend string, tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	m := mp.Meter(instrumentation)
	t := &telemetry{
		backendAttr: attribute.String("warden.backend", backend),
		byOutcome:   map[string][]metric.RecordOption{},
	}
	var err error
	if t.acquireDuration, err = m.Float64Histogram("warden.lock.acquire.duration",
		metric.WithUnit("s"), metric.WithDescription("Time to acquire a lock, waiting included, by outcome.")); err != nil {
		return nil, err
	}
	if t.holdDuration, err = m.Float64Histogram("warden.lock.hold.duration",
		metric.WithUnit("s"), metric.WithDescription("Time from a lock's grant to its unlock.")); err != nil {
		return nil, err
	}
	if t.held, err = m.Int64UpDownCounter("warden.lock.held",
		metric.WithUnit("{lock}"), metric.WithDescription("Locks held by this process.")); err != nil {
		return nil, err
	}
	if t.waiters, err = m.Int64UpDownCounter("warden.lock.waiters",
		metric.WithUnit("{acquisition}"), metric.WithDescription("Acquisitions of this process under way that wait while the lock is held elsewhere (Lock and Do without NoWait).")); err != nil {
		return nil, err
	}
	if t.renewalRequests, err = m.Int64Counter("warden.lock.renewal.requests",
		metric.WithUnit("{request}"), metric.WithDescription("Renewal requests sent to the backend (one per batch where it batches), by result.")); err != nil {
		return nil, err
	}
	if t.forceReleased, err = m.Int64Counter("warden.lock.force_released",
		metric.WithUnit("{lock}"), metric.WithDescription("Locks taken from their holders by an operator (Guard.ForceRelease).")); err != nil {
		return nil, err
	}
	if t.contended, err = m.Int64Counter("warden.lock.contended",
		metric.WithUnit("{acquisition}"), metric.WithDescription("Acquisitions that gave up because the lock was held elsewhere.")); err != nil {
		return nil, err
	}
	if t.lost, err = m.Int64Counter("warden.lock.lost",
		metric.WithUnit("{lock}"), metric.WithDescription("Held locks lost, by cause: the critical section's context was cancelled.")); err != nil {
		return nil, err
	}
	if t.refreshFailures, err = m.Int64Counter("warden.lock.refresh.failures",
		metric.WithUnit("{lease}"), metric.WithDescription("Watchdog refreshes that failed (transient or final).")); err != nil {
		return nil, err
	}
	if tp != nil {
		t.tracer = tp.Tracer(instrumentation)
	}
	t.onBackend = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(t.backendAttr))}
	t.onRecord = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(t.backendAttr))}
	// A gauge's series exists from the start, at zero, so that dashboards
	// and alerts on it see a value before the first wait.
	t.waiters.Add(context.Background(), 0, t.onBackend...)
	t.byCause = map[string][]metric.AddOption{}
	for _, c := range []string{causeExpired, causeTakenOver, causeSession, causeOverdue} {
		t.byCause[c] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(t.backendAttr, attribute.String("warden.cause", c)))}
	}
	t.byResult = map[bool][]metric.AddOption{}
	for ok, r := range map[bool]string{true: "ok", false: "error"} {
		t.byResult[ok] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(t.backendAttr, attribute.String("warden.result", r)))}
	}
	for _, o := range []string{outcomeAcquired, outcomeReentered, outcomeNotAcquired, outcomeCanceled, outcomeError} {
		t.byOutcome[o] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(t.backendAttr, attribute.String("warden.outcome", o)))}
	}
	return t, nil
}

func (t *telemetry) acquired(ctx context.Context, outcome string, took time.Duration) {
	if t.acquireDuration.Enabled(ctx) {
		t.acquireDuration.Record(ctx, took.Seconds(), t.byOutcome[outcome]...)
	}
	switch outcome {
	case outcomeAcquired:
		t.held.Add(ctx, 1, t.onBackend...)
	case outcomeNotAcquired:
		t.contended.Add(ctx, 1, t.onBackend...)
	}
}

// tracerFor returns the tracer for spans under ctx, or nil when nothing
// would record them: the Guard's own, else that of ctx's recording span,
// else the global provider once a program has set one. The global provider
// is read on every acquisition, so one set after New is used too; while it
// is otel's unset default, no span is started at all, which keeps the
// untraced path free of allocations.
func (t *telemetry) tracerFor(ctx context.Context) trace.Tracer {
	if t.tracer != nil {
		return t.tracer
	}
	if parent := trace.SpanFromContext(ctx); parent.IsRecording() {
		return parent.TracerProvider().Tracer(instrumentation)
	}
	if tp := otel.GetTracerProvider(); reflect.TypeOf(tp) != unsetGlobalTracerProvider {
		return tp.Tracer(instrumentation)
	}
	return nil
}

// unsetGlobalTracerProvider is the type of otel's global TracerProvider
// before any program sets one: a stand-in that records nothing.
var unsetGlobalTracerProvider = reflect.TypeOf(otel.GetTracerProvider())

// startSpan starts a span and hands back a nil span when it is not
// recorded, so that callers skip building attributes nobody will see.
func (t *telemetry) startSpan(ctx context.Context, tracer trace.Tracer, name, key string) (context.Context, trace.Span) {
	sctx, span := tracer.Start(ctx, name)
	if !span.IsRecording() {
		return ctx, nil
	}
	span.SetAttributes(t.backendAttr, attribute.String("warden.key", key))
	return sctx, span
}

func endSpan(span trace.Span, outcome string, err error, attrs ...attribute.KeyValue) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("warden.outcome", outcome))
	span.SetAttributes(attrs...)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

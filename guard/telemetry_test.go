package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
)

func TestSpansAndMetrics(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	f := newFaulty(t)
	g := newGuard(t, f, guard.WithTracerProvider(tp), guard.WithMeterProvider(mp),
		guard.WithBackendName("memory"), guard.WithTTL(90*time.Millisecond))
	ctx := context.Background()

	if err := g.Do(ctx, "report", func(context.Context, *guard.Lock) error { return nil }); err != nil {
		t.Fatal(err)
	}
	held, _ := g.Lock(ctx, "busy")
	g.Do(ctx, "busy", func(context.Context, *guard.Lock) error { return nil }, guard.NoWait())
	held.Unlock(ctx)
	notHeld := error(guard.ErrNotHeld)
	f.refreshErr.Store(&notHeld)
	err := g.Do(ctx, "lost", func(ctx context.Context, _ *guard.Lock) error { <-ctx.Done(); return nil })
	if !errors.Is(err, guard.ErrLockLost) {
		t.Fatalf("Do: %v", err)
	}

	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if len(byName["warden.acquire"]) != 4 || len(byName["warden.section"]) != 3 {
		t.Fatalf("spans: %d acquire, %d section; want 4 and 3", len(byName["warden.acquire"]), len(byName["warden.section"]))
	}
	attrs := func(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			m[kv.Key] = kv.Value
		}
		return m
	}
	first := attrs(byName["warden.acquire"][0])
	if first["warden.key"].AsString() != "report" || first["warden.backend"].AsString() != "memory" ||
		first["warden.outcome"].AsString() != "acquired" || first["warden.token"].AsInt64() == 0 {
		t.Errorf("acquire span attributes: %v", first)
	}
	if _, ok := first["warden.waited_ms"]; !ok {
		t.Error("acquire span has no warden.waited_ms")
	}
	if a := attrs(byName["warden.acquire"][2]); a["warden.outcome"].AsString() != "not_acquired" {
		t.Errorf("contended acquire outcome: %v", a["warden.outcome"])
	}
	lostSpan := byName["warden.section"][2]
	if a := attrs(lostSpan); a["warden.outcome"].AsString() != "lost" {
		t.Errorf("lost section outcome: %v", a["warden.outcome"])
	}
	var sawLoss bool
	for _, e := range lostSpan.Events() {
		sawLoss = sawLoss || e.Name == "warden.lock.lost"
	}
	if !sawLoss {
		t.Error("lost section span has no warden.lock.lost event")
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	holds := uint64(0)
	units := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			units[m.Name] = m.Unit
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sums[m.Name] += dp.Value
					if m.Name == "warden.lock.lost" {
						if c, _ := dp.Attributes.Value("warden.cause"); c.AsString() != "taken_over" {
							t.Errorf("loss by a refresh answered not held counted as %q", c.AsString())
						}
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == "warden.lock.hold.duration" {
					for _, dp := range d.DataPoints {
						holds += dp.Count
					}
				}
			}
		}
	}
	if sums["warden.lock.lost"] != 1 || sums["warden.lock.contended"] != 1 || sums["warden.lock.held"] != 0 || sums["warden.lock.refresh.failures"] < 1 ||
		sums["warden.lock.renewal.requests"] < 1 || holds != 3 {
		t.Errorf("metrics: %v, %d holds recorded; want 1 loss, 1 contended, none held, refresh failures and renewals, 3 holds", sums, holds)
	}
	for name, unit := range map[string]string{"warden.lock.acquire.duration": "s", "warden.lock.hold.duration": "s", "warden.lock.held": "{lock}"} {
		if units[name] != unit {
			t.Errorf("%s has unit %q, want %q", name, units[name], unit)
		}
	}
}

// Without WithTracerProvider, spans follow the caller's recording span, on
// that span's provider; with no recording span, none are made.
func TestSpansFollowTheParentSpan(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	g := newGuard(t, newFaulty(t))
	noop := func(context.Context, *guard.Lock) error { return nil }

	if err := g.Do(context.Background(), "untraced", noop); err != nil {
		t.Fatal(err)
	}
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	if err := g.Do(ctx, "traced", noop); err != nil {
		t.Fatal(err)
	}
	parent.End()

	var names []string
	for _, s := range spans.Ended() {
		names = append(names, s.Name())
		if s.Name() != "request" && s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %s is not a child of the request span", s.Name())
		}
	}
	if len(names) != 3 {
		t.Fatalf("spans %v, want warden.acquire and warden.section under request only", names)
	}
}

// TestWaitersGauge counts a Lock waiting on a held key as a waiter until it
// is granted, and a NoWait attempt never.
func TestWaitersGauge(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	g := newGuard(t, memory.New(), guard.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	ctx := context.Background()
	waiters := func() int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != "warden.lock.waiters" {
					continue
				}
				if m.Unit != "{acquisition}" {
					t.Errorf("warden.lock.waiters has unit %q", m.Unit)
				}
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					n += dp.Value
				}
			}
		}
		return n
	}
	held, err := g.Lock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.TryLock(ctx, "busy"); !errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("TryLock of a held key: %v", err)
	}
	if n := waiters(); n != 0 {
		t.Fatalf("%d waiters with nobody waiting", n)
	}
	granted := make(chan *guard.Lock)
	for range 2 {
		go func() {
			l, err := g.Lock(ctx, "busy")
			if err != nil {
				t.Error(err)
			}
			granted <- l
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for waiters() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("waiters = %d, want 2 while two Locks wait", waiters())
		}
		time.Sleep(5 * time.Millisecond)
	}
	held.Unlock(ctx)
	next := <-granted
	if n := waiters(); n != 1 {
		t.Fatalf("waiters = %d after one of two was granted, want 1", n)
	}
	next.Unlock(ctx)
	(<-granted).Unlock(ctx)
	if n := waiters(); n != 0 {
		t.Fatalf("waiters = %d once both were granted, want 0", n)
	}
}

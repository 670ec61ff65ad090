package idempotency

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Store operations, as the warden.idempotency.store.duration metric labels
// them.
const (
	opClaim    = "claim"
	opExtend   = "extend"
	opComplete = "complete"
	opAbandon  = "abandon"
	// opGet reads a record back after a refused Complete, to tell a
	// completion of this owner's whose answer was lost from a refusal.
	opGet = "get"
)

// storeMetrics times the Executor's calls to its Store: an operator tells a
// slow store from a slow handler by it, and a failing one by its results.
type storeMetrics struct {
	duration metric.Float64Histogram
	// by holds the measurement options of each operation and result, built
	// once so that recording allocates nothing.
	by map[[2]string][]metric.RecordOption
}

func newStoreMetrics(mp metric.MeterProvider) (*storeMetrics, error) {
	h, err := mp.Meter(instrumentation).Float64Histogram("warden.idempotency.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Time of the idempotency store's calls, by operation (claim, extend, complete, abandon, get) and result: ok "+
			"(answered, a refusal such as not_owner or not_found included) or error (the store failed or could not be reached)."))
	if err != nil {
		return nil, err
	}
	m := &storeMetrics{duration: h, by: map[[2]string][]metric.RecordOption{}}
	for _, op := range []string{opClaim, opExtend, opComplete, opAbandon, opGet} {
		for _, r := range []string{"ok", "error"} {
			m.by[[2]string{op, r}] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("warden.operation", op), attribute.String("warden.result", r)))}
		}
	}
	return m, nil
}

// record times one call of op, started at start, that returned err.
func (m *storeMetrics) record(ctx context.Context, op string, start time.Time, err error) {
	if !m.duration.Enabled(ctx) {
		return
	}
	result := "ok"
	if err != nil && !errors.Is(err, ErrNotOwner) && !errors.Is(err, ErrNotFound) {
		result = "error"
	}
	m.duration.Record(ctx, time.Since(start).Seconds(), m.by[[2]string{op, result}]...)
}

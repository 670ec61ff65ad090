package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/warden-go/warden/idempotency"
)

// downStore fails every claim, as a store that cannot be reached does.
type downStore struct{ idempotency.Store }

func (downStore) Claim(context.Context, idempotency.Claim) (*idempotency.Record, error) {
	return nil, errors.New("connection refused")
}

// TestStoreDurationMetric times every store call by operation and result,
// in seconds: a run claims and completes; a failed call is an error; a
// per-call meter provider gets that call's measurements.
func TestStoreDurationMetric(t *testing.T) {
	reader, other := sdkmetric.NewManualReader(), sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newExecutor(t, idempotency.NewMemoryStore(), idempotency.WithMeterProvider(mp))
	ctx := context.Background()
	fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	for range 2 {
		if _, err := e.Do(ctx, "k-1", "fp", fn); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Do(ctx, "k-2", "fp", func(context.Context) ([]byte, error) { return nil, errors.New("boom") }); err == nil {
		t.Fatal("fn's error was not returned")
	}
	if _, err := e.Do(ctx, "k-3", "fp", fn, idempotency.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(other)))); err != nil {
		t.Fatal(err)
	}
	// A Complete refused after it landed is checked by reading the record
	// back, a store call as much as the others.
	resent := newExecutor(t, resentCompletes{idempotency.NewMemoryStore()}, idempotency.WithMeterProvider(mp))
	if _, err := resent.Do(ctx, "k-5", "fp", fn); err != nil {
		t.Fatal(err)
	}
	down := newExecutor(t, downStore{idempotency.NewMemoryStore()}, idempotency.WithMeterProvider(mp))
	if _, err := down.Do(ctx, "k-4", "fp", fn); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Do on a failing store: %v, want ErrUnavailable", err)
	}

	counts := func(r *sdkmetric.ManualReader) map[string]uint64 {
		var rm metricdata.ResourceMetrics
		if err := r.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != "warden.idempotency.store.duration" {
					continue
				}
				if m.Unit != "s" {
					t.Errorf("unit %q, want s", m.Unit)
				}
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					op, _ := dp.Attributes.Value("warden.operation")
					res, _ := dp.Attributes.Value("warden.result")
					got[op.AsString()+"/"+res.AsString()] += dp.Count
				}
			}
		}
		return got
	}
	// Claims: k-1 twice (the second replays), k-2 once, k-5 once, and the
	// failed k-4. Completes: k-1's, and k-5's, refused since the client
	// sent it twice (an answer, so ok), and read back. Abandons: k-2's, and the
	// give-back of k-4's claim, whose answer was lost on a live ctx: that
	// one runs in the background, so it is waited for.
	want := map[string]uint64{"claim/ok": 4, "complete/ok": 2, "get/ok": 1, "abandon/ok": 2, "claim/error": 1}
	var got map[string]uint64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if got = counts(reader); got["abandon/ok"] >= want["abandon/ok"] || time.Now().After(deadline) {
			break
		}
	}
	if !equalCounts(got, want) {
		t.Fatalf("store calls by operation/result: %v, want %v", got, want)
	}
	if got, want := counts(other), map[string]uint64{"claim/ok": 1, "complete/ok": 1}; !equalCounts(got, want) {
		t.Fatalf("the per-call provider's store calls: %v, want %v", got, want)
	}
}

func equalCounts(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

package httpmw_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// TestIdempotencyMetrics: each keyed request is counted once, by outcome.
func TestIdempotencyMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore(), httpmw.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })))
	t.Cleanup(srv.Close)
	send := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "k-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send("a") // executed
	send("a") // replayed
	send("b") // key reused with another body
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	var storeCalls uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "warden.idempotency.store.duration" {
				for _, dp := range h.DataPoints {
					storeCalls += dp.Count
				}
			}
			if m.Name != "warden.idempotency.requests" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				o, _ := dp.Attributes.Value("warden.outcome")
				got[o.AsString()] += dp.Value
			}
		}
	}
	if got["executed"] != 1 || got["replayed"] != 1 || got["key_reused"] != 1 || len(got) != 3 {
		t.Fatalf("warden.idempotency.requests by outcome: %v", got)
	}
	// Three claims and one completion, timed on the middleware's provider.
	if storeCalls != 4 {
		t.Fatalf("warden.idempotency.store.duration counted %d store calls, want 4", storeCalls)
	}
	if _, err := httpmw.Idempotency(idempotency.NewMemoryStore(), httpmw.WithMeterProvider(nil)); err == nil {
		t.Fatal("a nil MeterProvider accepted")
	}
}

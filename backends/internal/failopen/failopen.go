// Package failopen serves a keyed request through httpmw.Idempotency on a
// backend's idempotency store, for the tests of a store that refuses its
// calls for good: httpmw must answer with an error and run no handler,
// WithFailOpen or not, where for a store that is down WithFailOpen serves
// the request unguarded.
package failopen

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// Serve sends one keyed POST through httpmw.Idempotency over st, with
// WithFailOpen when failOpen is set, and returns the answer's status and
// how many times the handler ran.
func Serve(t testing.TB, st idempotency.Store, failOpen bool) (status int, ran int32) {
	t.Helper()
	opts := []httpmw.IdempotencyOption{httpmw.WithLogger(slog.New(slog.DiscardHandler))}
	if failOpen {
		opts = append(opts, httpmw.WithFailOpen())
	}
	mw, err := httpmw.Idempotency(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":1}`))
	req.Header.Set(httpmw.DefaultHeader, "order-1")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, runs.Load()
}

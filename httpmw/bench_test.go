package httpmw_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// BenchmarkIdempotency measures the middleware's overhead with the memory
// store against the bare handler: a first request (claim, run, store) and a
// replay (one read).
func BenchmarkIdempotency(b *testing.B) {
	body := `{"item":"book","qty":1}`
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ord_1","status":"created"}`)
	})
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore(),
		httpmw.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	guarded := mw(h)
	serve := func(b *testing.B, handler http.Handler, key string) {
		req := httptest.NewRequest(http.MethodPost, "/orders?src=bench", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(b, h, "")
		}
	})
	i := 0 // outside the sub-benchmark, so that reruns with -count use fresh keys too
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			i++
			serve(b, guarded, "first-"+strconv.Itoa(i))
		}
	})
	b.Run("replay", func(b *testing.B) {
		serve(b, guarded, "replayed")
		b.ReportAllocs()
		for b.Loop() {
			serve(b, guarded, "replayed")
		}
	})
}

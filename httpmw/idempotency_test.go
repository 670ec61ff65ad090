package httpmw_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
)

func TestIdempotencyMemoryStore(t *testing.T) {
	st := idempotency.NewMemoryStore()
	httpmwtest.Run(t, func(testing.TB) idempotency.Store { return st })
}

// TestHandlerContextEndsOnShutdown: the handler's context, which outlives
// its client, ends when the server shuts down, with cause ErrShutdown.
func TestHandlerContextEndsOnShutdown(t *testing.T) {
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore())
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	cause := make(chan error, 1)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		cause <- context.Cause(r.Context())
		w.WriteHeader(http.StatusServiceUnavailable)
	})))
	defer srv.Close()
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"shutdown"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Config.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if c := <-cause; !errors.Is(c, httpmw.ErrShutdown) {
		t.Errorf("handler's context cause %v, want ErrShutdown", c)
	}
	if status := <-answered; status != http.StatusServiceUnavailable {
		t.Errorf("client got %d, want the handler's 503", status)
	}
}

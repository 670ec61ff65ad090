package httpmw_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// silentClaims is a store whose claims ignore their context and answer
// after a minute, as go-redis with its default options does for a server
// that stopped answering.
type silentClaims struct{ idempotency.Store }

func (s silentClaims) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	time.Sleep(time.Minute)
	return s.Store.Claim(context.WithoutCancel(ctx), c)
}

// TestIdempotencyCallTimeout: WithCallTimeout reaches the executor: a
// request whose context has no deadline gets 503 within the call timeout
// (and the executor's 20 ms grace) from a store that does not answer, and
// the handler does not run; an invalid timeout is refused, named.
func TestIdempotencyCallTimeout(t *testing.T) {
	if _, err := httpmw.Idempotency(idempotency.NewMemoryStore(), httpmw.WithCallTimeout(2)); !errors.Is(err, idempotency.ErrInvalid) ||
		!strings.Contains(err.Error(), "WithCallTimeout") {
		t.Errorf("WithCallTimeout(2): %v, want ErrInvalid naming it", err)
	}
	synctest.Test(t, func(t *testing.T) {
		mw, err := httpmw.Idempotency(silentClaims{idempotency.NewMemoryStore()}, httpmw.WithCallTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") }))
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", `"k"`)
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, req)
		if d := time.Since(start); w.Code != http.StatusServiceUnavailable || d > time.Second+20*time.Millisecond {
			t.Errorf("%d after %v, want 503 within 1.02s", w.Code, d)
		}
		time.Sleep(2 * time.Minute) // the claim's answer, and its give-back
	})
}

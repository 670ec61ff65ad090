package scheduler_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

// TestRequestCannotClaimASlot: a request through httpmw.Idempotency whose
// scope is the one slots are claimed in (a user who named themselves
// "warden.scheduler"), with a slot's key, on the store the Scheduler
// shares, does not claim the slot: the job still runs in it.
func TestRequestCannotClaimASlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := idempotency.NewMemoryStore()
		mw, err := httpmw.Idempotency(store, httpmw.WithScope(func(r *http.Request) string { return r.Header.Get("X-User") }))
		if err != nil {
			t.Fatal(err)
		}
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
		slot := time.Now().Truncate(time.Minute).Add(time.Minute)
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
		r.Header.Set("X-User", idempotency.ReservedScopePrefix+"scheduler")
		r.Header.Set("Idempotency-Key", "close@"+slot.UTC().Format(time.RFC3339Nano))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("request: %d, want 201", w.Code)
		}

		s, _ := newMemoryScheduler(t, scheduler.WithSlotStore(store))
		var runs atomic.Int32
		if err := s.Add("@every 1m", "close", func(context.Context) error {
			runs.Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		s.Start()
		time.Sleep(time.Until(slot) + 10*time.Second)
		if err := s.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("the job ran %d times in the slot the request named, want 1", n)
		}
	})
}

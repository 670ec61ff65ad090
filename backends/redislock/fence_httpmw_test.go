package redislock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/fence/fencetest"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/httpmw"
)

// fenceService is a service that accepts fenced writes over HTTP:
// httpmw.Fence in front, with gate as its Fencer (nil: none), and handlers
// that write with the claim of their request's context through f's fenced
// writes, whose fence the suite reads beside the data.
func fenceService(t testing.TB, gate fence.Fencer) *httptest.Server {
	f, err := NewFence(newClient(t))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /value", func(w http.ResponseWriter, r *http.Request) {
		claim, _ := fence.FromContext(r.Context())
		body, _ := io.ReadAll(r.Body)
		answerFenced(w, f.Set(r.Context(), claim, claim.Resource+":value", string(body), 0))
	})
	mux.HandleFunc("POST /count", func(w http.ResponseWriter, r *http.Request) {
		claim, _ := fence.FromContext(r.Context())
		_, err := f.IncrBy(r.Context(), claim, claim.Resource+":count", 1)
		answerFenced(w, err)
	})
	mw, err := httpmw.Fence(gate)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(mux))
	t.Cleanup(srv.Close)
	return srv
}

func answerFenced(w http.ResponseWriter, err error) {
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, fence.ErrStaleToken):
		httpmw.WriteStaleFence(w, err)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// httpFenceStore is the client: its writes are requests stamped by
// FenceTransport with the claim of their context; it reads Redis directly.
type httpFenceStore struct {
	base   string
	client *http.Client
	read   fencetest.Store
}

func (s httpFenceStore) post(ctx context.Context, c fence.Claim, path, body string) error {
	req, err := http.NewRequestWithContext(fence.WithClaim(ctx, c), "POST", s.base+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", driver.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusNoContent:
		return nil
	case http.StatusConflict:
		return fence.Stale(c, 0)
	case http.StatusBadRequest, http.StatusPreconditionRequired:
		return fmt.Errorf("%w: %s", driver.ErrInvalidOption, msg)
	}
	return fmt.Errorf("status %d: %s", resp.StatusCode, msg)
}

func (s httpFenceStore) Set(ctx context.Context, c fence.Claim, value string) error {
	return s.post(ctx, c, "/value", value)
}

func (s httpFenceStore) Incr(ctx context.Context, c fence.Claim) error {
	return s.post(ctx, c, "/count", "")
}

func (s httpFenceStore) Get(ctx context.Context, r string) (fencetest.State, error) {
	return s.read.Get(ctx, r)
}

// TestFenceThroughHTTP: the suite through httpmw.Fence and FenceTransport,
// on Redis. The middleware has no Fencer of its own: the handlers' fenced
// writes are the register the suite checks. A gate in front (its own fence,
// advanced at the check) refuses on tokens whose writes have not landed yet,
// which no register shows; TestFenceGateThroughHTTP tests it.
func TestFenceThroughHTTP(t *testing.T) {
	drivertest.Addr(t, addrEnv, addrDefault)
	srv := fenceService(t, nil)
	fencetest.Run(t, fencetest.Backend{
		New:      func(t testing.TB) fencetest.Store { return newHTTPFenceStore(t, srv.URL) },
		Through:  func(t testing.TB, relay string) fencetest.Store { return newHTTPFenceStore(t, "http://"+relay) },
		Upstream: strings.TrimPrefix(srv.URL, "http://"),
		Resource: fenceTag,
	})
}

func newHTTPFenceStore(t testing.TB, base string) httpFenceStore {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return httpFenceStore{base: base, client: &http.Client{Transport: httpmw.FenceTransport(tr)}, read: newFenceStore(t, newClient(t))}
}

// TestFenceGateThroughHTTP: httpmw.Fence with a Redis fence of its own
// prefix refuses a claim below the highest it let through before the
// handler runs, and moves only its own fence; it refuses, too, a claim the
// data's fence would still accept, once a higher one passed it.
func TestFenceGateThroughHTTP(t *testing.T) {
	drivertest.Addr(t, addrEnv, addrDefault)
	ctx := context.Background()
	gate, err := NewFence(newClient(t), WithFencePrefix("warden:fence-http:"))
	if err != nil {
		t.Fatal(err)
	}
	srv := fenceService(t, gate)
	s := newHTTPFenceStore(t, srv.URL)
	r := fenceTag("fence-gate/" + strconv.FormatInt(time.Now().UnixNano(), 10))
	claim := func(tok uint64) fence.Claim { return fence.Claim{Resource: r, Token: tok} }
	want := func(what string, gateHigh, dataHigh uint64, value string) {
		t.Helper()
		g, err := gate.Highest(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		st, err := s.Get(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if g != gateHigh || st.Highest != dataHigh || st.Value != value {
			t.Fatalf("%s: gate at %d, data at %d %q; want gate %d, data %d %q", what, g, st.Highest, st.Value, gateHigh, dataHigh, value)
		}
	}
	if err := s.Set(ctx, claim(5), "a"); err != nil {
		t.Fatal(err)
	}
	want("after a write at 5", 5, 5, "a")
	if err := s.Set(ctx, claim(4), "b"); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("a write at 4 after 5: %v, want 409", err)
	}
	want("after a refused write at 4", 5, 5, "a")
	// A request at 7 that passed the gate and has not written yet.
	if err := gate.Advance(ctx, claim(7)); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, claim(6), "c"); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("a write at 6 after the gate let 7 through: %v, want 409", err)
	}
	want("after the gate refused 6", 7, 5, "a")
	if err := s.Set(ctx, claim(7), "d"); err != nil {
		t.Fatal(err)
	}
	want("after a write at 7", 7, 7, "d")
}

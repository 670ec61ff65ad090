package redislock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/fence/fencetest"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/httpmw"
)

// fenceService is a service that accepts fenced writes over HTTP: Fence in
// front, keeping the highest tokens in Redis, and handlers that write with
// the claim of their request's context through Fence's writes. The
// middleware's tokens are kept apart from the data's fence (their own
// prefix), which the suite reads beside the data: the middleware's check
// moves its token before the handler writes.
func fenceService(t testing.TB) (*httptest.Server, *Fence) {
	c := newClient(t)
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	gate, err := NewFence(c, WithFencePrefix("warden:fence-http:"))
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
		if errors.Is(err, ErrReplyLost) {
			err = nil
		}
		answerFenced(w, err)
	})
	srv := httptest.NewServer(httpmw.Fence(gate)(mux))
	t.Cleanup(srv.Close)
	return srv, f
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
// on Redis.
func TestFenceThroughHTTP(t *testing.T) {
	drivertest.Addr(t, addrEnv, addrDefault)
	srv, _ := fenceService(t)
	store := func(t testing.TB, base string) fencetest.Store {
		tr := &http.Transport{}
		t.Cleanup(tr.CloseIdleConnections)
		return httpFenceStore{base: base, client: &http.Client{Transport: httpmw.FenceTransport(tr)}, read: newFenceStore(t, newClient(t))}
	}
	fencetest.Run(t, fencetest.Backend{
		New:      func(t testing.TB) fencetest.Store { return store(t, srv.URL) },
		Through:  func(t testing.TB, relay string) fencetest.Store { return store(t, "http://"+relay) },
		Upstream: strings.TrimPrefix(srv.URL, "http://"),
		Resource: fenceTag,
	})
}

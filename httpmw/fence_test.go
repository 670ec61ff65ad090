package httpmw_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/httpmw"
)

// mapFencer is a fence.Fencer in a map, or failing with err.
type mapFencer struct {
	mu      sync.Mutex
	highest map[string]uint64
	err     error
}

func (m *mapFencer) Advance(_ context.Context, c fence.Claim) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	if h := m.highest[c.Resource]; c.Token < h {
		return fence.Stale(c, h)
	}
	m.highest[c.Resource] = c.Token
	return nil
}

func TestFenceRequests(t *testing.T) {
	f := &mapFencer{highest: map[string]uint64{}}
	var seen fence.Claim
	h := fenced(t, f)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = fence.FromContext(r.Context())
		w.WriteHeader(http.StatusNoContent)
	}))
	for _, c := range []struct {
		name      string
		headers   [][2]string
		status    int
		anchor    string
		wantClaim fence.Claim
	}{
		{"accepted", [][2]string{{"Fencing-Token", "7"}, {"Fencing-Resource", "account/42"}}, 204, "", fence.Claim{Resource: "account/42", Token: 7}},
		{"equal", [][2]string{{"Fencing-Token", "7"}, {"Fencing-Resource", "account/42"}}, 204, "", fence.Claim{Resource: "account/42", Token: 7}},
		{"stale", [][2]string{{"Fencing-Token", "6"}, {"Fencing-Resource", "account/42"}}, 409, "Stale_fencing_token", fence.Claim{}},
		{"other resource", [][2]string{{"Fencing-Token", "6"}, {"Fencing-Resource", "account/43"}}, 204, "", fence.Claim{Resource: "account/43", Token: 6}},
		{"missing", nil, 428, "Missing_fencing_token", fence.Claim{}},
		{"zero", [][2]string{{"Fencing-Token", "0"}, {"Fencing-Resource", "r"}}, 400, "Invalid_fencing_token", fence.Claim{}},
		{"not a number", [][2]string{{"Fencing-Token", "-1"}, {"Fencing-Resource", "r"}}, 400, "Invalid_fencing_token", fence.Claim{}},
		{"two tokens", [][2]string{{"Fencing-Token", "8"}, {"Fencing-Token", "9"}, {"Fencing-Resource", "r"}}, 400, "Invalid_fencing_token", fence.Claim{}},
		{"no resource", [][2]string{{"Fencing-Token", "8"}}, 400, "Invalid_fencing_token", fence.Claim{}},
	} {
		seen = fence.Claim{}
		req := httptest.NewRequest("PUT", "/accounts/42", nil)
		for _, kv := range c.headers {
			req.Header.Add(kv[0], kv[1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.status || seen != c.wantClaim {
			t.Errorf("%s: status %d, handler saw %v; want %d, %v", c.name, rec.Code, seen, c.status, c.wantClaim)
		}
		if c.anchor != "" {
			var p struct{ Type string }
			json.Unmarshal(rec.Body.Bytes(), &p)
			if !strings.HasSuffix(p.Type, "#hdr-"+c.anchor) || rec.Header().Get("Content-Type") != "application/problem+json" {
				t.Errorf("%s: problem %q (%s), want type #hdr-%s", c.name, p.Type, rec.Header().Get("Content-Type"), c.anchor)
			}
		}
	}

	f.err = fmt.Errorf("%w: resource too long for this engine", guard.ErrInvalidKey)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("PUT", "/", nil)
	req.Header.Set("Fencing-Token", "99")
	req.Header.Set("Fencing-Resource", "r")
	h.ServeHTTP(rec, req)
	if rec.Code != 400 {
		t.Errorf("a resource the engine refuses: %d, want 400", rec.Code)
	}

	f.err = errors.New("down")
	rec = httptest.NewRecorder()
	req = httptest.NewRequest("PUT", "/", nil)
	req.Header.Set("Fencing-Token", "99")
	req.Header.Set("Fencing-Resource", "r")
	h.ServeHTTP(rec, req)
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" {
		t.Errorf("fence down: %d, Retry-After %q; want 503 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}
}

// TestFenceResourceFromRoute: WithFenceResource overrides the header.
func TestFenceResourceFromRoute(t *testing.T) {
	f := &mapFencer{highest: map[string]uint64{"route": 10}}
	h := fenced(t, f, httpmw.WithFenceResource(func(*http.Request) string { return "route" }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	req := httptest.NewRequest("PUT", "/", nil)
	req.Header.Set("Fencing-Token", "9")
	req.Header.Set("Fencing-Resource", "chosen-by-client")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusConflict {
		t.Errorf("status %d, want 409: the route's resource has accepted 10", rec.Code)
	}
}

// TestFenceTransport: a request made in guard.Do's function carries the
// lock's token; one that already has a token, or has no lock, goes as it is.
func TestFenceTransport(t *testing.T) {
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Clone() }))
	defer srv.Close()
	client := &http.Client{Transport: httpmw.FenceTransport(nil)}
	send := func(ctx context.Context, token string) {
		req, _ := http.NewRequestWithContext(ctx, "PUT", srv.URL, nil)
		if token != "" {
			req.Header.Set("Fencing-Token", token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if token != "" && req.Header.Get("Fencing-Resource") != "" {
			t.Error("the transport changed the caller's request")
		}
	}
	g, err := guard.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	err = g.Do(context.Background(), "account/42", func(ctx context.Context, l *guard.Lock) error {
		send(ctx, "")
		if got.Get("Fencing-Token") != strconv.FormatUint(l.Token(), 10) || got.Get("Fencing-Resource") != "account/42" {
			t.Errorf("headers %v, want the lock's token %d on account/42", got, l.Token())
		}
		send(ctx, "5")
		if got.Get("Fencing-Token") != "5" || got.Get("Fencing-Resource") != "" {
			t.Errorf("a request with its own token: %v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	send(context.Background(), "")
	if got.Get("Fencing-Token") != "" {
		t.Errorf("a request without a lock was stamped: %v", got)
	}
}

// fenced is httpmw.Fence, failing t on an error.
func fenced(t *testing.T, f fence.Fencer, opts ...httpmw.FenceOption) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := httpmw.Fence(f, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// TestFenceRefusesBadConfiguration: a nil option, WithFenceResource(nil),
// which would leave the resource to the client after all, and a negative
// Retry-After are refused when the middleware is built, with errors that
// name them; a nil option panicked there.
func TestFenceRefusesBadConfiguration(t *testing.T) {
	f := &mapFencer{highest: map[string]uint64{}}
	for _, c := range []struct {
		name string
		opts []httpmw.FenceOption
		want string
	}{
		{"nil option", []httpmw.FenceOption{nil}, "option 0 is nil"},
		{"nil resource", []httpmw.FenceOption{httpmw.WithFenceResource(nil)}, "nil WithFenceResource"},
		{"negative Retry-After", []httpmw.FenceOption{httpmw.WithFenceRetryAfter(-time.Second)}, "negative"},
	} {
		mw, err := httpmw.Fence(f, c.opts...)
		if mw != nil || !errors.Is(err, guard.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: (%v, %v), want ErrInvalidOption naming %q", c.name, mw != nil, err, c.want)
		}
	}
}

// TestFenceTransportOddResources: a claim reaches the service on the
// resource it names, or the request is not sent: a header cannot carry a
// leading or trailing space or tab (the server trims them, making "a " the
// resource "a") nor a control byte.
func TestFenceTransportOddResources(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Fencing-Resource"))
	}))
	defer srv.Close()
	client := &http.Client{Transport: httpmw.FenceTransport(nil)}
	for _, r := range []string{"a", "a b", "a\tb", "/", "\xff\xfe", "é", strings.Repeat("x", fence.MaxResource)} {
		got = nil
		ctx := fence.WithClaim(context.Background(), fence.Claim{Resource: r, Token: 7})
		req, _ := http.NewRequestWithContext(ctx, "PUT", srv.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("resource %q: %v", r, err)
			continue
		}
		resp.Body.Close()
		if len(got) != 1 || got[0] != r {
			t.Errorf("resource %q reached the service as %q", r, got)
		}
	}
	for _, c := range []fence.Claim{{Resource: "a", Token: 0}, {Resource: "", Token: 7}} {
		req, _ := http.NewRequestWithContext(fence.WithClaim(context.Background(), c), "PUT", srv.URL, nil)
		if resp, err := client.Do(req); err == nil || !errors.Is(err, guard.ErrInvalidOption) {
			if err == nil {
				resp.Body.Close()
			}
			t.Errorf("invalid claim %+v: %v, want ErrInvalidOption", c, err)
		}
	}
	for _, r := range []string{"a ", " a", "a\t", "\ta", "a\x00b", "a\r\nb", "a\nb", "a\x7fb"} {
		got = nil
		ctx := fence.WithClaim(context.Background(), fence.Claim{Resource: r, Token: 7})
		req, _ := http.NewRequestWithContext(ctx, "PUT", srv.URL, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if !errors.Is(err, guard.ErrInvalidOption) || !strings.Contains(err.Error(), strconv.Quote(r)) {
			t.Errorf("resource %q: %v, want an error wrapping guard.ErrInvalidOption that names it", r, err)
		}
		if got != nil {
			t.Errorf("resource %q was sent, and reached the service as %q", r, got)
		}
	}
}

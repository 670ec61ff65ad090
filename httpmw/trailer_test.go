package httpmw_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// trailing answers with a declared trailer, a trailer named with
// http.TrailerPrefix, and a field set after the status, which net/http
// drops.
func trailing(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Trailer", "Digest")
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, "made")
	w.Header().Set("Digest", "sha-256=abc")
	w.Header().Set(http.TrailerPrefix+"Server-Timing", "db;dur=1")
	w.Header().Set("X-Late", "dropped")
}

type answer struct {
	status          int
	header, trailer http.Header
	body, replayed  string
}

func postTrailing(t *testing.T, url, key string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, resp.Trailer, string(body), resp.Header.Get(httpmw.ReplayedHeader)}
}

// TestTrailersSentAsTrailers: the handler's trailers reach the client as
// trailers, on the first response and on its replay, as they do without the
// middleware; a field set after the status is neither sent nor stored.
func TestTrailersSentAsTrailers(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(trailing))
	defer plain.Close()
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore(),
		httpmw.WithReplayHeaders("Content-Type", "Digest", "Server-Timing", "X-Late"))
	if err != nil {
		t.Fatal(err)
	}
	guarded := httptest.NewServer(mw(http.HandlerFunc(trailing)))
	defer guarded.Close()

	want := postTrailing(t, plain.URL, "")
	if want.trailer.Get("Digest") != "sha-256=abc" || want.trailer.Get("Server-Timing") != "db;dur=1" || want.header.Get("Digest") != "" {
		t.Fatalf("net/http without the middleware: header %v, trailer %v", want.header, want.trailer)
	}
	for i, replayed := range []string{"", "true"} {
		got := postTrailing(t, guarded.URL, `"trailers"`)
		if got.replayed != replayed {
			t.Fatalf("request %d: %s %q, want %q", i+1, httpmw.ReplayedHeader, got.replayed, replayed)
		}
		if got.status != want.status || got.body != want.body {
			t.Errorf("request %d: %d %q, want %d %q", i+1, got.status, got.body, want.status, want.body)
		}
		for _, name := range []string{"Digest", "Server-Timing", "X-Late"} {
			if g, w := got.header.Get(name), want.header.Get(name); g != w {
				t.Errorf("request %d: header %s %q, want %q", i+1, name, g, w)
			}
			if g, w := got.trailer.Get(name), want.trailer.Get(name); g != w {
				t.Errorf("request %d: trailer %s %q, want %q", i+1, name, g, w)
			}
		}
	}
}

// TestTrailersWhenStreamed: a handler that flushes streams its response,
// and its trailers still go out as trailers.
func TestTrailersWhenStreamed(t *testing.T) {
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Digest")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "part")
		w.Header().Set("Digest", "early")
		http.NewResponseController(w).Flush()
		io.WriteString(w, "rest")
		w.Header().Set("Digest", "sha-256=abc")
	})))
	defer srv.Close()
	got := postTrailing(t, srv.URL, `"streamed"`)
	if got.body != "partrest" || got.header.Get("Digest") != "" || got.trailer.Get("Digest") != "sha-256=abc" {
		t.Errorf("got %q, header %v, trailer %v", got.body, got.header, got.trailer)
	}
}

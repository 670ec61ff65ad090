package httpmw_test

import (
	"bytes"
	"io"
	"log"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// Handlers that do what net/http allows and careless handlers do: each
// test serves one through Idempotency on a memory store and sends its
// requests as a client would.

func serveIdempotent(t *testing.T, h http.Handler, opts ...httpmw.IdempotencyOption) *httptest.Server {
	t.Helper()
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(mw(h))
	// The handlers' panics are the tests' subject, not news.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// postKeyed sends a keyed POST and returns its status and body, or the error of
// a response cut short.
func postKeyed(t *testing.T, srv *httptest.Server, key string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// A reverse proxy whose copy of the upstream's answer fails panics with
// http.ErrAbortHandler after the upstream did the work: the key is
// recorded as executed, and no retry sends the request upstream again.
func TestReverseProxyAbortIsExecuted(t *testing.T) {
	for _, tc := range []struct {
		name string
		// upstream answers the first request it gets; the client of the
		// first attempt hangs up when hangUp is set.
		upstream func(w http.ResponseWriter)
		hangUp   bool
	}{
		{"upstream cut mid-body", func(w http.ResponseWriter) {
			c, bw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			bw.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("x", 500))
			bw.Flush()
			c.Close()
		}, false},
		{"client gone mid-body", func(w http.ResponseWriter) {
			// More than WithMaxResponse, so the middleware streams it, and
			// long enough that the client has hung up before it ends.
			chunk := bytes.Repeat([]byte("x"), 600<<10)
			w.WriteHeader(http.StatusCreated)
			w.Write(chunk)
			http.NewResponseController(w).Flush()
			time.Sleep(300 * time.Millisecond)
			for range 8 {
				w.Write(chunk)
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var orders atomic.Int64
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if orders.Add(1) == 1 {
					tc.upstream(w)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			defer upstream.Close()
			u, err := url.Parse(upstream.URL)
			if err != nil {
				t.Fatal(err)
			}
			srv := serveIdempotent(t, httputil.NewSingleHostReverseProxy(u))
			if tc.hangUp {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":1}`))
				req.Header.Set("Idempotency-Key", "order-1")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			} else if _, _, err := postKeyed(t, srv, "order-1"); err == nil {
				t.Error("the first attempt's cut response reached the client whole")
			}
			var status int
			var body string
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				status, body, _ = postKeyed(t, srv, "order-1")
				if !strings.Contains(body, "In_progress") || time.Now().After(deadline) {
					break
				}
			}
			if n := orders.Load(); n != 1 || status != http.StatusConflict || !strings.Contains(body, "Response_not_stored") {
				t.Errorf("upstream ran %d times; the retry got %d %s: want once, and 409 Response not stored", n, status, body)
			}
		})
	}
}

// A status net/http refuses fails the handler before anything is stored,
// as it does without the middleware: the key is not left completed with a
// response no replay can write.
func TestInvalidStatusNotStored(t *testing.T) {
	var runs atomic.Int64
	srv := serveIdempotent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			w.WriteHeader(42)
		}
		io.WriteString(w, "done")
	}))
	if _, _, err := postKeyed(t, srv, "status"); err == nil {
		t.Error("the handler's invalid status was answered")
	}
	if status, body, err := postKeyed(t, srv, "status"); err != nil || status != http.StatusOK || body != "done" || runs.Load() != 2 {
		t.Errorf("retry: %d %q %v after %d runs; want the second run's 200", status, body, err, runs.Load())
	}
}

// A flush before WriteHeader sends net/http's 200, which the status written
// after it cannot change: the record says 200 too, so a store policy that
// frees the key on a 503 does not run the work again for a client answered
// 200.
func TestFlushSendsTheStatusRecorded(t *testing.T) {
	var runs atomic.Int64
	srv := serveIdempotent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.(http.Flusher).Flush()
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "partial")
	}), httpmw.WithStorePolicy(httpmw.RetryableStorePolicy))
	if status, _, err := postKeyed(t, srv, "flush"); err != nil || status != http.StatusOK {
		t.Fatalf("first: %d %v, want net/http's 200", status, err)
	}
	status, body, err := postKeyed(t, srv, "flush")
	if err != nil || runs.Load() != 1 || !strings.Contains(body, "executed with status 200") {
		t.Errorf("retry: %d %q %v after %d runs; want no second run, and the 200 recorded", status, body, err, runs.Load())
	}
}

// A body over an outer http.MaxBytesHandler's limit, lower than WithMaxBody,
// is answered 413 with that limit, not 400 "unreadable".
func TestOuterBodyLimit(t *testing.T) {
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.MaxBytesHandler(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the handler ran")
	})), 5))
	defer srv.Close()
	status, body, err := postKeyed(t, srv, "big")
	if err != nil || status != http.StatusRequestEntityTooLarge || !strings.Contains(body, "limited to 5 bytes") {
		t.Errorf("%d %q %v, want 413 naming the 5-byte limit", status, body, err)
	}
}

// The longest WithRetryAfter is announced as the whole seconds it holds,
// rounded up, not as a number its rounding overflowed into the negative.
func TestLongestRetryAfter(t *testing.T) {
	started, finish := make(chan struct{}), make(chan struct{})
	srv := serveIdempotent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-finish
	}), httpmw.WithRetryAfter(math.MaxInt64))
	first := make(chan error, 1)
	go func() {
		_, _, err := postKeyed(t, srv, "long")
		first <- err
	}()
	<-started
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "long")
	resp, err := srv.Client().Do(req)
	close(finish)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if want := "9223372037"; resp.StatusCode != http.StatusConflict || resp.Header.Get("Retry-After") != want {
		t.Errorf("duplicate in progress: %d with Retry-After %q, want 409 with %s", resp.StatusCode, resp.Header.Get("Retry-After"), want)
	}
	if err := <-first; err != nil {
		t.Errorf("first request: %v", err)
	}
}

// A method is matched whatever its case: "post" from a careless client
// reaches a handler that does not look at the method as POST does, and so
// is guarded as POST is, rather than run once per retry.
func TestMethodCase(t *testing.T) {
	var runs atomic.Int64
	srv := serveIdempotent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}), httpmw.WithMethods("post", "Purge"))
	for _, method := range []string{"post", "POST", "purge"} {
		for range 2 {
			req, err := http.NewRequest(method, srv.URL+"/orders", strings.NewReader(`{"item":1}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", "case-"+method)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("three methods sent twice each ran the handler %d times, want 3", n)
	}
}

// Under WithFailOpen, a handler run unguarded because the store cannot be
// reached still gets its request's key from KeyFromContext: a downstream
// service's own deduplication is then all that stands between a retry and
// a second order.
func TestFailOpenKeepsKey(t *testing.T) {
	// A Redis store whose server's port is closed: every claim is refused.
	st, err := redislock.NewStore(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpmw.Idempotency(st, httpmw.WithFailOpen(), httpmw.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Value
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := httpmw.KeyFromContext(r.Context())
		got.Store(k)
	})))
	defer srv.Close()
	if status, _, err := postKeyed(t, srv, `"order-77"`); err != nil || status != http.StatusOK {
		t.Fatalf("fail-open request: %d %v, want the handler's 200", status, err)
	}
	if k, _ := got.Load().(string); k != "order-77" {
		t.Errorf("KeyFromContext in the handler run unguarded: %q, want %q", k, "order-77")
	}
}

// One middleware mounted under two prefixes by http.StripPrefix sees both
// mounts' requests at the same path: a payment sent with the key an order
// was sent with is another request, refused 422, not answered with the
// order while no payment is made.
func TestStripPrefixMountsAreDifferentRequests(t *testing.T) {
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore())
	if err != nil {
		t.Fatal(err)
	}
	var orders, payments atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("/orders/", http.StripPrefix("/orders", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders.Add(1)
		io.WriteString(w, "order")
	}))))
	mux.Handle("/payments/", http.StripPrefix("/payments", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments.Add(1)
		io.WriteString(w, "payment")
	}))))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(path string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{"amount":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "one")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := post("/orders/"); status != http.StatusOK || body != "order" {
		t.Fatalf("order: %d %q", status, body)
	}
	if status, body := post("/payments/"); status != http.StatusUnprocessableEntity || payments.Load() != 0 {
		t.Errorf("payment with the order's key: %d %q after %d payments, want 422 Key reused", status, body, payments.Load())
	}
	if status, body := post("/orders/"); status != http.StatusOK || body != "order" || orders.Load() != 1 {
		t.Errorf("order retried: %d %q after %d orders, want the order replayed", status, body, orders.Load())
	}
}

// A request made in process may carry no body at all (a nil Body, which
// http.Client takes for an empty one): it is fingerprinted as empty, not
// a nil dereference that takes the caller down.
func TestNilBody(t *testing.T) {
	mw, err := httpmw.Idempotency(idempotency.NewMemoryStore())
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "done")
	}))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/orders", nil)
		r.Body = nil
		r.Header.Set("Idempotency-Key", "no-body")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK || w.Body.String() != "done" {
			t.Errorf("%d %q, want the handler's 200", w.Code, w.Body.String())
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}

// The middleware applied twice to a request, by mistake (to the router and
// again to a route) or as two middlewares on one store, runs the handler
// once per key as one does: the inner one does not find the outer one's
// claim "in progress" and answer the 409 the outer one would keep as the
// key's outcome, with the handler never run.
func TestNestedIdempotency(t *testing.T) {
	st := idempotency.NewMemoryStore()
	mw, err := httpmw.Idempotency(st)
	if err != nil {
		t.Fatal(err)
	}
	other, err := httpmw.Idempotency(st)
	if err != nil {
		t.Fatal(err)
	}
	// A route's own middleware that fingerprints the body alone.
	bodyOnly, err := httpmw.Idempotency(st, httpmw.WithFingerprint(func(_ *http.Request, body []byte) string { return string(body) }))
	if err != nil {
		t.Fatal(err)
	}
	// A middleware between the two that rewrites the body (a decoder).
	rewrite := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Body = io.NopCloser(strings.NewReader(`{"decoded":true}`))
			h.ServeHTTP(w, r)
		})
	}
	for name, wrap := range map[string]func(http.Handler) http.Handler{
		"twice":             func(h http.Handler) http.Handler { return mw(mw(h)) },
		"one-store":         func(h http.Handler) http.Handler { return other(mw(h)) },
		"other-fingerprint": func(h http.Handler) http.Handler { return mw(bodyOnly(h)) },
		"body-rewritten":    func(h http.Handler) http.Handler { return mw(rewrite(mw(h))) },
	} {
		t.Run(name, func(t *testing.T) {
			var runs atomic.Int64
			srv := httptest.NewServer(wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "made")
			})))
			defer srv.Close()
			for i := range 3 {
				status, body, err := postKeyed(t, srv, "nested-"+name)
				if err != nil || status != http.StatusCreated || body != "made" {
					t.Errorf("request %d: %d %q %v, want 201 made", i, status, body, err)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want once", n)
			}
		})
	}
}

// A handler that passes its request's key and context on to another route
// guarded on the same records (an in-process call to /payments from
// /checkout) makes another request under the key: it is not the outer
// claim's, so it is refused as a reuse of the key, not run unguarded, and
// its retry runs nothing either.
func TestNestedIdempotencyOtherRequest(t *testing.T) {
	for name, opts := range map[string][]httpmw.IdempotencyOption{
		"default fingerprint": nil,
		// Equal for the checkout and the payment, which carry one body.
		"body alone": {httpmw.WithFingerprint(func(_ *http.Request, body []byte) string { return "same" })},
	} {
		t.Run(name, func(t *testing.T) { nestedOtherRequest(t, opts) })
	}
}

func nestedOtherRequest(t *testing.T, opts []httpmw.IdempotencyOption) {
	st := idempotency.NewMemoryStore()
	mw, err := httpmw.Idempotency(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var payments atomic.Int64
	pay := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	var statuses []int
	checkout := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := httpmw.KeyFromContext(r.Context())
		for range 2 { // the call and its retry
			req := httptest.NewRequestWithContext(r.Context(), http.MethodPost, "/payments", strings.NewReader(`{"amount":5}`))
			req.Header.Set("Idempotency-Key", key)
			rec := httptest.NewRecorder()
			pay.ServeHTTP(rec, req)
			statuses = append(statuses, rec.Code)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(checkout)
	defer srv.Close()
	if status, _, err := postKeyed(t, srv, "checkout-1"); err != nil || status != http.StatusCreated {
		t.Fatalf("checkout: %d, %v", status, err)
	}
	// Refused as a reuse of the key (422), or as the checkout's claim in
	// progress (409) when the fingerprints are equal.
	refused := func(code int) bool {
		return code == http.StatusUnprocessableEntity || code == http.StatusConflict
	}
	if n := payments.Load(); n != 0 || len(statuses) != 2 || !refused(statuses[0]) || !refused(statuses[1]) {
		t.Errorf("the payment under the checkout's key ran %d times, answered %v; want 0 runs, refused twice", n, statuses)
	}
}

// A replay carries the Content-Type its first response had: none when the
// handler suppressed net/http's sniffing (a nil Content-Type), rather than
// one sniffed from the body on replay; the sniffed one when the handler set
// none.
func TestReplaySniffsAsTheFirstResponse(t *testing.T) {
	for name, h := range map[string]http.HandlerFunc{
		"suppressed": func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = nil
			io.WriteString(w, "<html>made</html>")
		},
		"sniffed": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "<html>made</html>")
		},
	} {
		t.Run(name, func(t *testing.T) {
			srv := serveIdempotent(t, h)
			var types [2][]string
			for i := range types {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":1}`))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", "sniff")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				types[i] = resp.Header["Content-Type"]
			}
			if !slices.Equal(types[0], types[1]) {
				t.Errorf("Content-Type %q on the first response, %q on its replay", types[0], types[1])
			}
		})
	}
}

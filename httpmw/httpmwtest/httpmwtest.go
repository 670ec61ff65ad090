// Package httpmwtest runs the behaviour tests of httpmw.Idempotency over real
// HTTP (httptest servers and a real client) against any idempotency.Store,
// so that every store shows the middleware's guarantees hold on it:
//
//	func TestHTTP(t *testing.T) {
//		httpmwtest.Run(t, func(t testing.TB) idempotency.Store { ... })
//	}
//
// As in storetest, every call of the factory returns a client of the same
// store. The suite serves each test from several servers, each with its own
// client, as a fleet of instances behind a load balancer would be.
//
// The suite checks the rule of the package documentation: once a handler
// has been called its key never runs again, whatever the client does (it
// leaves before the answer; the answer is larger than the limit, streamed,
// hijacked, a 101), and only a panic or an outcome the store policy does not
// keep frees the key. It also checks long scopes against a literal scope
// that spells their hash, and that bad options fail at construction.
//
// Every wait is a deadline on a condition, never a fixed sleep whose length
// decides the outcome.
package httpmwtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// patience bounds every wait on a condition: reaching it means the behaviour
// is wrong, not slow.
const patience = 30 * time.Second

// lease is the in-progress lease of the expiry test.
const lease = 500 * time.Millisecond

// Run runs the behaviour tests as subtests of t. newStore returns a new
// client of the store under test.
func Run(t *testing.T, newStore func(t testing.TB) idempotency.Store) {
	if newStore == nil {
		t.Fatal("httpmwtest: newStore is nil")
	}
	s := &suite{newStore: newStore}
	t.Run("ConcurrentIdenticalRunOnce", s.testConcurrent)
	t.Run("MismatchedPayload422", s.testMismatch)
	t.Run("ScopeIsolation", s.testScope)
	t.Run("ReplayHeaders", s.testReplayHeaders)
	t.Run("ExpiredLeaseLetsRetryRun", s.testLeaseExpiry)
	t.Run("StorePolicy", s.testServerError)
	t.Run("PanicReleasesAndRepanics", s.testPanic)
	t.Run("ClientGoneStillStored", s.testClientGone)
	t.Run("StreamedNotReplayable", s.testStreamed)
	t.Run("HijackedNotReplayable", s.testHijacked)
	t.Run("SwitchingProtocolsNotReplayable", s.testSwitchingProtocols)
	t.Run("LongScopeCollision", s.testLongScope)
	t.Run("InvalidOptions", s.testInvalidOptions)
	t.Run("WaitThenReplay", s.testWait)
	t.Run("KeyValidation", s.testKeys)
	t.Run("BodyTooLarge", s.testBodyTooLarge)
	t.Run("StoreUnavailable", s.testUnavailable)
}

type suite struct {
	newStore func(t testing.TB) idempotency.Store
}

var seq atomic.Int64

// key returns an idempotency key no earlier test has used.
func key(t testing.TB) string {
	return fmt.Sprintf("httpmwtest-%d-%d", time.Now().UnixNano(), seq.Add(1))
}

// serve starts a server running h behind the middleware over st.
func serve(t testing.TB, st idempotency.Store, h http.Handler, opts ...httpmw.IdempotencyOption) string {
	t.Helper()
	mw, err := httpmw.Idempotency(st, opts...)
	if err != nil {
		t.Fatalf("Idempotency: %v", err)
	}
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	return srv.URL
}

// fleet starts n servers, each with its own client of the store.
func (s *suite) fleet(t testing.TB, n int, h http.Handler, opts ...httpmw.IdempotencyOption) []string {
	urls := make([]string, n)
	for i := range urls {
		urls[i] = serve(t, s.newStore(t), h, opts...)
	}
	return urls
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get(httpmw.ReplayedHeader) == "true" }

// send makes one request with a real client. key "" sends no key header.
func send(t testing.TB, ctx context.Context, method, url, key, body string, header ...string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatalf("NewRequest: %v", err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func mustSend(t testing.TB, method, url, key, body string, header ...string) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	r, err := send(t, ctx, method, url, key, body, header...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

// sendAsync sends from another goroutine; failures are reported with
// t.Error, since t.Fatal may only be called from the test's own goroutine.
func sendAsync(t testing.TB, method, url, key, body string, header ...string) <-chan response {
	ch := make(chan response, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		r, err := send(t, ctx, method, url, key, body, header...)
		if err != nil {
			t.Errorf("%s %s: %v", method, url, err)
		}
		ch <- r
	}()
	return ch
}

func expectProblem(t testing.TB, r response, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d (body %q), want %d", r.status, r.body, status)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(r.body, &p); err != nil || p.Status != status || p.Type == "" || p.Title == "" {
		t.Errorf("problem body %q: %v", r.body, err)
	}
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", patience, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// created answers 201 with a body unique to each run of the handler, so a
// replay is told from a second run.
func created(runs *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"run":%d,"nonce":%q}`, n, rand.Text())
	}
}

// testConcurrent: 64 identical requests spread over four servers run the
// handler once; one gets 2xx, the rest 409 or a byte-identical replay.
func (s *suite) testConcurrent(t *testing.T) {
	const n = 64
	var runs, answered atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Hold the first request in flight until every duplicate has been
		// answered, or long enough that some must have been.
		deadline := time.Now().Add(patience)
		for answered.Load() < n-1 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		created(&runs)(w, r)
	})
	urls := s.fleet(t, 4, h)
	k := key(t)
	var wg sync.WaitGroup
	resps := make([]response, n)
	for i := range n {
		wg.Go(func() {
			defer answered.Add(1)
			resps[i] = <-sendAsync(t, http.MethodPost, urls[i%len(urls)]+"/orders", k, `{"item":"book"}`)
		})
	}
	wg.Wait()
	var first *response
	for i := range resps {
		if r := &resps[i]; r.status == http.StatusOK && !r.replayed() {
			if first != nil {
				t.Fatalf("two fresh 2xx answers: %q and %q", first.body, r.body)
			}
			first = r
		}
	}
	if first == nil {
		t.Fatal("no request ran the handler")
	}
	for i := range n {
		r := resps[i]
		switch {
		case &resps[i] == first:
		case r.status == http.StatusConflict:
			expectProblem(t, r, http.StatusConflict)
			if r.header.Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
		case r.replayed() && r.status == first.status && bytes.Equal(r.body, first.body):
		default:
			t.Errorf("request %d: status %d, replayed %v, body %q; want 409 or a replay of %q", i, r.status, r.replayed(), r.body, first.body)
		}
	}
	// After the first completes, every server replays it.
	for _, u := range urls {
		r := mustSend(t, http.MethodPost, u+"/orders", k, `{"item":"book"}`)
		if !r.replayed() || r.status != first.status || !bytes.Equal(r.body, first.body) {
			t.Errorf("after completion: status %d, replayed %v, body %q; want a replay of %q", r.status, r.replayed(), r.body, first.body)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
}

func (s *suite) testMismatch(t *testing.T) {
	var runs atomic.Int64
	urls := s.fleet(t, 2, created(&runs))
	k := key(t)
	mustSend(t, http.MethodPost, urls[0]+"/orders", k, `{"amount":10}`)
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodPost, "/orders", `{"amount":11}`},
		{http.MethodPost, "/orders?dry=1", `{"amount":10}`},
		{http.MethodPost, "/refunds", `{"amount":10}`},
		{http.MethodPatch, "/orders", `{"amount":10}`},
	} {
		expectProblem(t, mustSend(t, tc.method, urls[1]+tc.path, k, tc.body), http.StatusUnprocessableEntity)
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
}

// testScope: the same key from two principals is two requests; neither ever
// receives the other's response.
func (s *suite) testScope(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		fmt.Fprintf(w, "secret of %s", r.Header.Get("X-User"))
	})
	// X-User stands in for the identity an authentication middleware
	// would establish; a real service never scopes by a client's header.
	urls := s.fleet(t, 2, h, httpmw.WithScope(func(r *http.Request) string { return r.Header.Get("X-User") }))
	k := key(t)
	for _, user := range []string{"alice", "bob"} {
		for i := range 2 {
			r := mustSend(t, http.MethodPost, urls[i]+"/pay", k, "same body", "X-User", user)
			if want := "secret of " + user; string(r.body) != want {
				t.Errorf("%s got %q, want %q", user, r.body, want)
			}
			if r.replayed() != (i == 1) {
				t.Errorf("%s's request %d: replayed %v", user, i, r.replayed())
			}
		}
	}
	if runs.Load() != 2 {
		t.Errorf("handler ran %d times, want 2 (once per principal)", runs.Load())
	}
}

func (s *suite) testReplayHeaders(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Location", "/orders/7")
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("X-Private", "not on the allow-list")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order 7\x00\xff")
	})
	url := serve(t, s.newStore(t), h)
	k := key(t)
	first := mustSend(t, http.MethodPost, url, k, "x")
	again := mustSend(t, http.MethodPost, url, k, "x")
	if first.replayed() || !again.replayed() {
		t.Fatalf("replayed flags %v then %v, want false then true", first.replayed(), again.replayed())
	}
	if again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) {
		t.Errorf("replay: %d %q, want %d %q", again.status, again.body, first.status, first.body)
	}
	for _, name := range []string{"Content-Type", "Location"} {
		if again.header.Get(name) != first.header.Get(name) {
			t.Errorf("replayed %s %q, want %q", name, again.header.Get(name), first.header.Get(name))
		}
	}
	for _, name := range []string{"Set-Cookie", "X-Private"} {
		if v := again.header.Get(name); v != "" {
			t.Errorf("replay carries %s: %q", name, v)
		}
	}
}

// cutOff is a store client of a server cut off from the store after it
// claimed: its renewals fail.
type cutOff struct{ idempotency.Store }

func (cutOff) Extend(context.Context, string, string, string, time.Duration) error {
	return fmt.Errorf("%w: partitioned", idempotency.ErrUnavailable)
}

// testLeaseExpiry: a server whose handler hangs while it cannot renew its
// claim loses it when the lease runs out; a retry on another server then
// runs, and the stale server's late completion is refused.
func (s *suite) testLeaseExpiry(t *testing.T) {
	var runs, staleRuns atomic.Int64
	release := make(chan struct{})
	staleCause := make(chan error, 1)
	staleStarted := make(chan struct{})
	hanging := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if staleRuns.Add(1) > 1 {
			// The key ran again on the stale server: reported below, as
			// the failure it is, rather than as a panic on a closed channel.
			io.WriteString(w, "stale again")
			return
		}
		close(staleStarted)
		select {
		case <-r.Context().Done():
		case <-release: // the test ended first
		}
		staleCause <- context.Cause(r.Context())
		<-release // a handler that keeps going after being told to stop
		io.WriteString(w, "stale")
	})
	staleURL := serve(t, cutOff{s.newStore(t)}, hanging, httpmw.WithLease(lease))
	// The retry's claim keeps the default lease: only the stale claim's
	// expiry is under test, and a retry whose short claim lapsed before its
	// Complete on a busy machine would leave the key to run a third time.
	freshURL := serve(t, s.newStore(t), created(&runs))
	// Registered after serve, so it runs before the servers' Close, which
	// waits for the hanging handler: a test that fails halfway ends.
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	k := key(t)

	staleResp := sendAsync(t, http.MethodPost, staleURL, k, "pay")
	select {
	case <-staleStarted:
	case r := <-staleResp:
		t.Fatalf("first request answered %d %q without running its handler; the test needs it claimed and running", r.status, r.body)
	case <-time.After(patience):
		t.Fatalf("the first request's handler did not start within %v", patience)
	}
	var fresh response
	eventually(t, "the stale claim expires and a retry runs", func() bool {
		fresh = mustSend(t, http.MethodPost, freshURL, k, "pay")
		return fresh.status != http.StatusConflict
	})
	if fresh.status != http.StatusOK || fresh.replayed() {
		t.Fatalf("retry after expiry: %d, replayed %v, %q; want a fresh 200", fresh.status, fresh.replayed(), fresh.body)
	}
	select {
	case cause := <-staleCause:
		if !errors.Is(cause, idempotency.ErrNotOwner) {
			t.Errorf("stale handler's context cause %v, want ErrNotOwner", cause)
		}
	case <-time.After(patience):
		t.Fatal("the stale handler's context was not cancelled")
	}
	free()
	if r := <-staleResp; string(r.body) != "stale" {
		t.Errorf("stale client got %d %q, want its handler's own response", r.status, r.body)
	}
	r := mustSend(t, http.MethodPost, staleURL, k, "pay")
	if !r.replayed() || !bytes.Equal(r.body, fresh.body) {
		t.Errorf("after the stale completion: %d %q replayed %v; want the retry's %q", r.status, r.body, r.replayed(), fresh.body)
	}
	if n := staleRuns.Load(); n != 1 {
		t.Errorf("the stale server ran the key's handler %d times, want once", n)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the retry's server ran the key's handler %d times, want once", n)
	}
}

// statusSequence answers the statuses in turn, then 201.
func statusSequence(runs *atomic.Int64, statuses ...int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := int(runs.Add(1))
		status := http.StatusCreated
		if n <= len(statuses) {
			status = statuses[n-1]
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, "run %d", n)
	}
}

// testServerError: by default every answer of a handler that ran is kept,
// a 500 included; RetryableStorePolicy frees the key after a 5xx or 429.
func (s *suite) testServerError(t *testing.T) {
	var runs atomic.Int64
	url := serve(t, s.newStore(t), statusSequence(&runs, http.StatusInternalServerError))
	k := key(t)
	for i := range 3 {
		r := mustSend(t, http.MethodPost, url, k, "body")
		if r.status != http.StatusInternalServerError || r.replayed() != (i > 0) {
			t.Errorf("default policy, request %d: %d replayed %v, want the 500 (replayed after the first)", i, r.status, r.replayed())
		}
	}
	if runs.Load() != 1 {
		t.Errorf("default policy: handler ran %d times, want 1", runs.Load())
	}
	runs.Store(0)
	url = serve(t, s.newStore(t), statusSequence(&runs, http.StatusInternalServerError, http.StatusTooManyRequests, http.StatusBadGateway),
		httpmw.WithStorePolicy(httpmw.RetryableStorePolicy))
	k = key(t)
	for i, want := range []int{500, 429, 502, 201, 201} {
		r := mustSend(t, http.MethodPost, url, k, "body")
		if r.status != want || r.replayed() != (i == 4) {
			t.Errorf("request %d: %d replayed %v, want %d replayed %v", i, r.status, r.replayed(), want, i == 4)
		}
	}
	if runs.Load() != 4 {
		t.Errorf("handler ran %d times, want 4", runs.Load())
	}
	// A 4xx other than 429 is the request's answer, and is kept.
	var runs4 atomic.Int64
	url = serve(t, s.newStore(t), statusSequence(&runs4, http.StatusBadRequest), httpmw.WithStorePolicy(httpmw.RetryableStorePolicy))
	k = key(t)
	mustSend(t, http.MethodPost, url, k, "body")
	if r := mustSend(t, http.MethodPost, url, k, "body"); r.status != http.StatusBadRequest || !r.replayed() {
		t.Errorf("after a 400: %d replayed %v, want the 400 replayed", r.status, r.replayed())
	}
}

// testPanic: the middleware releases the claim and lets the panic go on; an
// outer recoverer sees the handler's own value.
func (s *suite) testPanic(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("handler bug")
		}
		io.WriteString(w, "ok")
	})
	mw, err := httpmw.Idempotency(s.newStore(t))
	if err != nil {
		t.Fatal(err)
	}
	recovered := make(chan any, 1)
	inner := mw(h)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				recovered <- v
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	k := key(t)
	if r := mustSend(t, http.MethodPost, srv.URL, k, "x"); r.status != http.StatusInternalServerError {
		t.Errorf("panicking handler: %d, want the recoverer's 500", r.status)
	}
	if v := <-recovered; v != "handler bug" {
		t.Errorf("recovered %v, want the handler's panic value", v)
	}
	if r := mustSend(t, http.MethodPost, srv.URL, k, "x"); r.status != http.StatusOK || r.replayed() || string(r.body) != "ok" {
		t.Errorf("retry after a panic: %d %q replayed %v, want a fresh 200", r.status, r.body, r.replayed())
	}
}

// testClientGone: a client that gives up before the answer (its timeout
// shorter than the handler) and retries with the same key gets the first
// run's answer, never a second run. By default the handler's context goes
// on after the client left; with WithRequestContext it ends, and what the
// handler answers then is kept all the same.
func (s *suite) testClientGone(t *testing.T) {
	for _, requestCtx := range []bool{false, true} {
		t.Run(fmt.Sprintf("RequestContext=%v", requestCtx), func(t *testing.T) {
			var runs atomic.Int64
			started := make(chan struct{}, 1)
			clientGone := make(chan struct{})
			ctxEnded := make(chan bool, 1)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				if n == 1 {
					started <- struct{}{}
					<-clientGone
					if requestCtx {
						<-r.Context().Done()
					}
					ctxEnded <- r.Context().Err() != nil
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "order of run %d", n)
			})
			var opts []httpmw.IdempotencyOption
			if requestCtx {
				opts = append(opts, httpmw.WithRequestContext())
			}
			urls := s.fleet(t, 2, h, opts...)
			// Registered after the fleet, so it runs before the servers'
			// Close, which waits for the held handler: a test that fails
			// halfway ends.
			var once sync.Once
			leave := func() { once.Do(func() { close(clientGone) }) }
			t.Cleanup(leave)
			k := key(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := send(t, ctx, http.MethodPost, urls[0], k, "x")
				done <- err
			}()
			select {
			case <-started:
			case err := <-done:
				t.Fatalf("first request ended (error %v) without running its handler; the test needs it claimed and running", err)
			case <-time.After(patience):
				t.Fatalf("the first request's handler did not start within %v", patience)
			}
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the cancelled client got an answer")
			}
			leave()
			if ended := <-ctxEnded; ended != requestCtx {
				t.Errorf("handler's context ended when the client left: %v, want %v", ended, requestCtx)
			}
			for _, u := range urls {
				var r response
				eventually(t, "the first run's answer is stored", func() bool {
					r = mustSend(t, http.MethodPost, u, k, "x")
					return r.status != http.StatusConflict
				})
				if r.status != http.StatusCreated || !r.replayed() || string(r.body) != "order of run 1" {
					t.Errorf("retry after the client left: %d %q replayed %v, want run 1's 201 replayed", r.status, r.body, r.replayed())
				}
			}
			if runs.Load() != 1 {
				t.Errorf("handler ran %d times, want 1", runs.Load())
			}
		})
	}
}

// settled sends a retry until it is no longer answered "In progress": a
// response that streamed reaches its client before its record is written.
func settled(t testing.TB, url, k, body string) response {
	t.Helper()
	var r response
	eventually(t, "the first request's record is written", func() bool {
		r = mustSend(t, http.MethodPost, url, k, body)
		return r.status != http.StatusConflict || !bytes.Contains(r.body, []byte("In_progress"))
	})
	return r
}

// expectNotStored checks r is the 409 "Response not stored" a retry of an
// executed, not replayable request gets.
func expectNotStored(t testing.TB, r response) {
	t.Helper()
	expectProblem(t, r, http.StatusConflict)
	if !bytes.Contains(r.body, []byte("Response_not_stored")) {
		t.Errorf("409 of type %q, want Response not stored", r.body)
	}
}

// testStreamed: a response that is flushed, or larger than WithMaxResponse,
// reaches its client whole; its key is completed as executed, not
// replayable, and retries get 409 "Response not stored" on every server,
// never a second run.
func (s *suite) testStreamed(t *testing.T) {
	var flushed, large atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := flushed.Add(1)
		io.WriteString(w, "part 1;")
		http.NewResponseController(w).Flush()
		fmt.Fprintf(w, "part 2 of run %d", n)
	})
	big := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		large.Add(1)
		w.Header().Set("Location", "/orders/7")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, strings.Repeat("x", 2000))
	})
	var swollen atomic.Int64
	// Headers that swell the record past what a store keeps, whatever the
	// body's limit says.
	headers := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		swollen.Add(1)
		w.Header().Set("Link", "<"+strings.Repeat("l", idempotency.MaxResponseLen)+">")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "small body")
	})
	for _, tc := range []struct {
		name string
		urls []string
		runs *atomic.Int64
		want string
	}{
		{"flushed", s.fleet(t, 2, h), &flushed, "part 1;part 2 of run 1"},
		{"larger than the limit", s.fleet(t, 2, big, httpmw.WithMaxResponse(1024)), &large, strings.Repeat("x", 2000)},
		{"headers past the store's limit", s.fleet(t, 2, headers), &swollen, "small body"},
	} {
		k := key(t)
		if r := mustSend(t, http.MethodPost, tc.urls[0], k, "x"); r.replayed() || string(r.body) != tc.want {
			t.Errorf("%s: first request got %q replayed %v, want a fresh %q", tc.name, r.body, r.replayed(), tc.want)
		}
		for i := range 3 {
			expectNotStored(t, settled(t, tc.urls[i%2], k, "x"))
		}
		if tc.runs.Load() != 1 {
			t.Errorf("%s: handler ran %d times for four requests, want 1", tc.name, tc.runs.Load())
		}
	}
	// The status and headers that fit are kept: the retry of the large
	// response learns its status and where the order is.
	url := s.fleet(t, 1, big, httpmw.WithMaxResponse(1024))[0]
	k := key(t)
	mustSend(t, http.MethodPost, url, k, "x")
	if r := settled(t, url, k, "x"); !bytes.Contains(r.body, []byte("status 201")) || r.header.Get("Location") != "/orders/7" {
		t.Errorf("retry of a large response: %q, Location %q; want the 201 named and Location /orders/7", r.body, r.header.Get("Location"))
	}
}

// testHijacked: a handler that takes the connection over runs once; its
// retries get 409 "Response not stored".
func (s *suite) testHijacked(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
		buf.Flush()
	})
	urls := s.fleet(t, 2, h)
	k := key(t)
	if r := mustSend(t, http.MethodPost, urls[0], k, "x"); string(r.body) != "hijacked" {
		t.Errorf("hijacking handler's client got %d %q", r.status, r.body)
	}
	for i := range 2 {
		expectNotStored(t, settled(t, urls[i], k, "x"))
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
}

// testSwitchingProtocols: a 101 is a final answer, never recorded as a 200:
// its retries get 409 "Response not stored".
func (s *suite) testSwitchingProtocols(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "warden-test")
		w.WriteHeader(http.StatusSwitchingProtocols)
	})
	url := serve(t, s.newStore(t), h)
	k := key(t)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", `"`+k+`"`)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "warden-test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("upgrade request: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Errorf("upgrade request: %d, want 101", resp.StatusCode)
	}
	for range 2 {
		r := settled(t, url, k, "x")
		if r.status == http.StatusOK {
			t.Fatalf("retry of a 101 got %d %q replayed %v: the 101 was recorded as a 200", r.status, r.body, r.replayed())
		}
		expectNotStored(t, r)
		if !bytes.Contains(r.body, []byte("status 101")) {
			t.Errorf("409 detail %q does not name the 101", r.body)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
}

// testLongScope: a scope too long to store is kept as its hash, which no
// literal scope can spell: a caller whose scope is the string the old
// scheme stored a long scope as gets its own run, not the other's response.
func (s *suite) testLongScope(t *testing.T) {
	long := strings.Repeat("tenant-", 50) // 350 bytes
	sum := sha256.Sum256([]byte(long))
	literal := "sha256:" + hex.EncodeToString(sum[:])
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "secret of scope %d bytes long", len(r.Header.Get("X-Test-Scope")))
	})
	// The scope comes from a header only because this is a test: a real
	// service takes it from what its authentication established.
	url := serve(t, s.newStore(t), h, httpmw.WithScope(func(r *http.Request) string { return r.Header.Get("X-Test-Scope") }))
	k := key(t)
	a := mustSend(t, http.MethodPost, url, k, "x", "X-Test-Scope", long)
	b := mustSend(t, http.MethodPost, url, k, "x", "X-Test-Scope", literal)
	if b.replayed() || bytes.Equal(a.body, b.body) {
		t.Errorf("scope %q got %q replayed %v: the long scope's response", literal, b.body, b.replayed())
	}
	if again := mustSend(t, http.MethodPost, url, k, "x", "X-Test-Scope", long); !again.replayed() || !bytes.Equal(again.body, a.body) {
		t.Errorf("the long scope's retry got %q replayed %v, want its own response replayed", again.body, again.replayed())
	}
}

// testInvalidOptions: every option out of range is refused when the
// middleware is built, with an error naming it, never at request time.
func (s *suite) testInvalidOptions(t *testing.T) {
	st := s.newStore(t)
	for _, tc := range []struct {
		name string
		opt  httpmw.IdempotencyOption
		want string
	}{
		{"2ns lease", httpmw.WithLease(2), "WithLease"},
		{"microsecond lease", httpmw.WithLease(time.Microsecond), "WithLease"},
		{"nanosecond wait", httpmw.WithWait(time.Nanosecond), "WithWait"},
		{"zero retention", httpmw.WithRetention(0), "WithRetention"},
		{"MaxInt64 body", httpmw.WithMaxBody(math.MaxInt64), "WithMaxBody"},
		{"zero body", httpmw.WithMaxBody(0), "WithMaxBody"},
		{"MaxInt response", httpmw.WithMaxResponse(math.MaxInt), "WithMaxResponse"},
		{"header with a space", httpmw.WithHeader("Idempotency Key"), "WithHeader"},
		{"empty header", httpmw.WithHeader(""), "WithHeader"},
		{"no methods", httpmw.WithMethods(), "WithMethods"},
		{"bad method", httpmw.WithMethods("PO ST"), "WithMethods"},
		{"negative Retry-After", httpmw.WithRetryAfter(-time.Second), "WithRetryAfter"},
		{"nil scope", httpmw.WithScope(nil), "WithScope"},
		{"nil fingerprint", httpmw.WithFingerprint(nil), "WithFingerprint"},
		{"nil store policy", httpmw.WithStorePolicy(nil), "WithStorePolicy"},
		{"nil logger", httpmw.WithLogger(nil), "WithLogger"},
		{"nil tracer", httpmw.WithTracerProvider(nil), "WithTracerProvider"},
		{"nil meter", httpmw.WithMeterProvider(nil), "WithMeterProvider"},
		{"nil option", nil, "nil IdempotencyOption"},
	} {
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("%s: Idempotency panicked: %v", tc.name, v)
				}
			}()
			mw, err := httpmw.Idempotency(st, tc.opt)
			if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: (%v, %v), want ErrInvalid naming %s", tc.name, mw != nil, err, tc.want)
			}
		}()
	}
	if _, err := httpmw.Idempotency(nil); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "nil idempotency.Store") {
		t.Errorf("nil store: %v, want ErrInvalid naming the store", err)
	}
	if _, err := httpmw.Idempotency(st, httpmw.WithLease(time.Millisecond), httpmw.WithMaxBody(httpmw.MaxBodyLimit),
		httpmw.WithHeader("X-Request-Key"), httpmw.WithMethods("put")); err != nil {
		t.Errorf("options at their limits: %v", err)
	}
}

func (s *suite) testWait(t *testing.T) {
	var runs atomic.Int64
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		created(&runs)(w, r)
	})
	// Count the requests that reached the servers, so that the first is
	// released only once the waiters are there.
	var arrived atomic.Int64
	mw, err := httpmw.Idempotency(s.newStore(t), httpmw.WithWait(patience))
	if err != nil {
		t.Fatal(err)
	}
	guarded := mw(h)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		guarded.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	other := serve(t, s.newStore(t), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the second server ran the handler")
	}), httpmw.WithWait(patience))
	// Registered after the servers, so it runs before their Close, which
	// waits for the held handler: a test that fails halfway ends.
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	k := key(t)
	first := sendAsync(t, http.MethodPost, srv.URL, k, "x")
	select {
	case <-started:
	case r := <-first:
		t.Fatalf("first request answered %d %q without running its handler; the test needs it claimed and running", r.status, r.body)
	case <-time.After(patience):
		t.Fatalf("the first request's handler did not start within %v", patience)
	}
	var waiters []<-chan response
	for range 2 {
		waiters = append(waiters, sendAsync(t, http.MethodPost, srv.URL, k, "x"), sendAsync(t, http.MethodPost, other, k, "x"))
	}
	eventually(t, "the waiters reach the first server", func() bool { return arrived.Load() == 3 })
	free()
	f := <-first
	for _, w := range waiters {
		if r := <-w; !r.replayed() || !bytes.Equal(r.body, f.body) {
			t.Errorf("waiter got %d %q replayed %v, want a replay of %q", r.status, r.body, r.replayed(), f.body)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
}

func (s *suite) testKeys(t *testing.T) {
	var runs atomic.Int64
	st := s.newStore(t)
	url := serve(t, st, created(&runs))
	required := serve(t, st, created(&runs), httpmw.WithRequireKey())
	long := make([]byte, httpmw.MaxKeyLen+1)
	for i := range long {
		long[i] = 'k'
	}
	for name, values := range map[string][]string{
		"repeated":  {`"a"`, `"b"`},
		"empty":     {`""`},
		"too long":  {string(long)},
		"parameter": {`"a";p=1`},
		"list":      {`"a", "b"`},
		"unclosed":  {`"a`},
		"trailing":  {`"a"` + strings.Repeat("<script>", 1000)},
	} {
		req, _ := http.NewRequest(http.MethodPost, url, nil)
		for _, v := range values {
			req.Header.Add("Idempotency-Key", v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Run(name, func(t *testing.T) {
			expectProblem(t, response{status: resp.StatusCode, header: resp.Header, body: b}, http.StatusBadRequest)
			// The detail repeats at most a short, escaped prefix of the value.
			if len(b) > 512 || bytes.Count(b, []byte("script")) > 2 {
				t.Errorf("400 of %d bytes echoes the value: %.200q", len(b), b)
			}
		})
	}
	expectProblem(t, mustSend(t, http.MethodPost, required, "", "x"), http.StatusBadRequest)
	// Without a key, or with a method not guarded, requests pass through.
	mustSend(t, http.MethodPost, url, "", "x")
	k := key(t)
	mustSend(t, http.MethodPut, url, k, "x")
	mustSend(t, http.MethodPut, url, k, "x")
	if r := mustSend(t, http.MethodGet, required, "", ""); r.status != http.StatusOK {
		t.Errorf("GET without a key where keys are required: %d", r.status)
	}
	if runs.Load() != 4 {
		t.Errorf("handler ran %d times, want 4 (the pass-throughs)", runs.Load())
	}
	// A bare (unquoted) key works like the quoted one.
	k = key(t)
	a := mustSend(t, http.MethodPost, url, "", "x", "Idempotency-Key", k)
	b := mustSend(t, http.MethodPost, url, k, "x")
	if !b.replayed() || !bytes.Equal(a.body, b.body) {
		t.Errorf("quoted key after the same bare key: %q replayed %v, want a replay of %q", b.body, b.replayed(), a.body)
	}
}

func (s *suite) testBodyTooLarge(t *testing.T) {
	var runs atomic.Int64
	url := serve(t, s.newStore(t), created(&runs), httpmw.WithMaxBody(16))
	expectProblem(t, mustSend(t, http.MethodPost, url, key(t), "0123456789abcdefX"), http.StatusRequestEntityTooLarge)
	if r := mustSend(t, http.MethodPost, url, key(t), "0123456789abcdef"); r.status != http.StatusOK {
		t.Errorf("body at the limit: %d", r.status)
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}
}

// down is a store client that cannot reach its server.
type down struct{ idempotency.Store }

func (down) Claim(context.Context, idempotency.Claim) (*idempotency.Record, error) {
	return nil, fmt.Errorf("%w: connection refused", idempotency.ErrUnavailable)
}

func (s *suite) testUnavailable(t *testing.T) {
	var runs atomic.Int64
	closed := serve(t, down{s.newStore(t)}, created(&runs))
	open := serve(t, down{s.newStore(t)}, created(&runs), httpmw.WithFailOpen())
	r := mustSend(t, http.MethodPost, closed, key(t), "x")
	expectProblem(t, r, http.StatusServiceUnavailable)
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("503 Retry-After %q", r.header.Get("Retry-After"))
	}
	if runs.Load() != 0 {
		t.Error("the handler ran although the middleware fails closed")
	}
	if r := mustSend(t, http.MethodPost, open, key(t), "x"); r.status != http.StatusOK || runs.Load() != 1 {
		t.Errorf("fail-open: %d, handler ran %d times; want 200 and one run", r.status, runs.Load())
	}
}

package consullock

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// faultyTransport lets a test decide the fate of each request a client
// sends to the real agent: fate returns what to do with it.
type faultyTransport struct {
	base http.RoundTripper
	fate func(r *http.Request, body string) fate
	// afterDrop, if set, runs after a request whose answer is dropped was
	// answered, before its failure is returned.
	afterDrop func()
}

type fate int

const (
	pass      fate = iota
	lose           // never sent: the request fails as a connection would
	dropReply      // sent and applied, then the answer is lost
	hang           // sent nowhere, and never answered until the request ends
)

func (ft *faultyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var body string
	if r.Body != nil {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body.Close()
		body = string(b)
		r.Body = io.NopCloser(strings.NewReader(body))
	}
	switch ft.fate(r, body) {
	case lose:
		return nil, errors.New("connection reset (injected)")
	case hang:
		<-r.Context().Done()
		return nil, r.Context().Err()
	case dropReply:
		resp, err := ft.base.RoundTrip(r)
		if err == nil {
			resp.Body.Close()
		}
		if ft.afterDrop != nil {
			ft.afterDrop()
		}
		return nil, errors.New("connection reset after the request was sent (injected)")
	}
	return ft.base.RoundTrip(r)
}

// faultyLocker is a Locker on the test agent whose requests go through
// ft, with the client's own transport as its base.
func faultyLocker(t *testing.T, ft *faultyTransport) *Locker {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = addr(t)
	t.Cleanup(cfg.Transport.CloseIdleConnections)
	ft.base = cfg.Transport
	cfg.HttpClient = &http.Client{Transport: ft}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lockerOn(t, c)
}

// isRelease tells a release transaction (check-index, delete) of key.
func isRelease(r *http.Request, body, key string) bool {
	return r.URL.Path == "/v1/txn" && strings.Contains(body, `"Verb":"delete"`) &&
		strings.Contains(body, `"Verb":"check-index"`) && strings.Contains(body, `"Key":"`+key+`"`)
}

// lockTwo acquires locks a and b with l: one to release, one that its
// session must keep.
func lockTwo(t *testing.T, l *Locker, a, b string) (driver.Lease, driver.Lease) {
	t.Helper()
	var les []driver.Lease
	for _, k := range []string{a, b} {
		le, err := l.Acquire(context.Background(), k, driver.AcquireOptions{TTL: MinTTL})
		if err != nil {
			t.Fatal(err)
		}
		les = append(les, le)
	}
	return les[0], les[1]
}

// TestReleaseOutcomeUnknown: a release whose answer is lost (a leader
// killed with it in flight) is sent again, owner-checked on the key's
// ModifyIndex, until Consul answers, and the session, and every other lock
// it keeps, lives on. Before, the session was given up at once: the other
// lock was lost with it, and the released one came back only when the
// session's destroy got through.
func TestReleaseOutcomeUnknown(t *testing.T) {
	c := newClient(t, addr(t))
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: MinTTL}
	cases := []struct {
		name string
		fate fate
		// between runs after the first send failed, before the resend.
		between func(t *testing.T, key string) driver.Lease
	}{
		// The first send was applied: the resend finds the key gone,
		// which counts as released.
		{name: "applied, answer lost", fate: dropReply},
		// The first send never arrived: the resend deletes the key.
		{name: "never sent", fate: lose},
		// The first send was applied and someone else took the lock
		// before the resend: the resend must leave the newer holder's
		// key alone.
		{name: "applied, then taken", fate: dropReply, between: func(t *testing.T, key string) driver.Lease {
			le, err := lockerOn(t, newClient(t, addr(t))).Acquire(ctx, key, opts)
			if err != nil {
				t.Errorf("the newer holder's acquisition: %v", err)
				return nil
			}
			return le
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k, other := name("unknown"), name("other")
			var (
				faults atomic.Int32
				sends  atomic.Int32
				newer  driver.Lease
			)
			ft := &faultyTransport{fate: func(r *http.Request, body string) fate {
				if !isRelease(r, body, LockKey(k)) {
					return pass
				}
				sends.Add(1)
				if faults.Add(1) > 1 {
					return pass
				}
				return tc.fate
			}}
			if tc.between != nil {
				ft.afterDrop = func() { newer = tc.between(t, k) }
			}
			le, kept := lockTwo(t, faultyLocker(t, ft), k, other)
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := le.Release(rctx); err != nil {
				t.Fatalf("Release with its first answer lost: %v", err)
			}
			if n := sends.Load(); n != 2 {
				t.Errorf("%d release sends, want 2", n)
			}
			kv, _, err := c.KV().Get(LockKey(k), nil)
			switch {
			case err != nil:
				t.Fatal(err)
			case newer == nil && kv != nil:
				t.Errorf("the lock key is still there after the release: %+v", kv)
			case newer != nil && (kv == nil || kv.ModifyIndex != newer.Token()):
				t.Errorf("the newer holder's key (token %d) was touched by the resend: %+v", newer.Token(), kv)
			}
			s := kept.(*lease).s
			if s.lost() {
				t.Fatal("the session was given up: its other lock is lost")
			}
			if err := kept.Refresh(ctx, MinTTL); err != nil {
				t.Errorf("the session's other lock: %v", err)
			}
			if newer != nil {
				newer.Release(ctx)
			}
		})
	}
}

// TestReleaseResentInBackground: a release that gets no answer for longer
// than its caller waits returns an error wrapping ErrUnavailable when the
// caller's context ends, and the resend goes on: once Consul answers
// again, the key goes, and the session with its other lock lives on.
func TestReleaseResentInBackground(t *testing.T) {
	c := newClient(t, addr(t))
	ctx := context.Background()
	k, other := name("background"), name("other")
	var down atomic.Bool
	down.Store(true)
	l := faultyLocker(t, &faultyTransport{fate: func(r *http.Request, body string) fate {
		if isRelease(r, body, LockKey(k)) && down.Load() {
			return hang
		}
		return pass
	}})
	le, kept := lockTwo(t, l, k, other)
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := le.Release(rctx); !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Release unanswered: got %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Release returned %v after its context's 300ms", took)
	}
	if kv, _, err := c.KV().Get(LockKey(k), nil); err != nil || kv == nil {
		t.Fatalf("the key before Consul answers: %+v, %v", kv, err)
	}
	down.Store(false)
	// The hanging send ends at the request timeout; the next one lands.
	deadline := time.Now().Add(DefaultRequestTimeout + 2*time.Second)
	for {
		kv, _, err := c.KV().Get(LockKey(k), nil)
		if err != nil {
			t.Fatal(err)
		}
		if kv == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key is still there: the background resend did not land")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := kept.Refresh(ctx, MinTTL); err != nil || kept.(*lease).s.lost() {
		t.Errorf("the session's other lock after the resend: %v (session lost %v)", err, kept.(*lease).s.lost())
	}
}

// TestCloseStopsResend: Close does not wait for a release that Consul
// never answers; it destroys the session, which takes the key with it.
func TestCloseStopsResend(t *testing.T) {
	c := newClient(t, addr(t))
	ctx := context.Background()
	k := name("close")
	l := faultyLocker(t, &faultyTransport{fate: func(r *http.Request, body string) fate {
		if isRelease(r, body, LockKey(k)) {
			return lose
		}
		return pass
	}})
	le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := le.Release(rctx); !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Release refused every time: got %v, want ErrUnavailable", err)
	}
	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close took %v with a release being resent", took)
	}
	if kv, _, err := c.KV().Get(LockKey(k), nil); err != nil || kv != nil {
		t.Errorf("the key after Close: %+v, %v", kv, err)
	}
}

// TestWaiterRechecksHangingQuery: a waiter whose blocking queries go to a
// server that never answers them (a frozen leader keeps its connections
// open) re-checks with a consistent read after queryBound, and so takes a
// lock freed meanwhile within about that long, not at the end of its
// context.
func TestWaiterRechecksHangingQuery(t *testing.T) {
	ctx := context.Background()
	k := name("hanging")
	holder := lockerOn(t, newClient(t, addr(t)))
	var hung atomic.Int32
	waiter := faultyLocker(t, &faultyTransport{fate: func(r *http.Request, _ string) fate {
		if r.URL.Query().Has("index") && !strings.Contains(r.URL.Path, RevokedPrefix) {
			hung.Add(1)
			return hang
		}
		return pass
	}})
	for _, fair := range []bool{false, true} {
		le, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL})
		if err != nil {
			t.Fatal(err)
		}
		hung.Store(0)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var (
			got      driver.Lease
			gotErr   error
			gotAt    time.Time
			finished = make(chan struct{})
		)
		go func() {
			defer close(finished)
			got, gotErr = waiter.Acquire(wctx, k, driver.AcquireOptions{TTL: MinTTL, Wait: true, Fair: fair})
			gotAt = time.Now()
		}()
		deadline := time.Now().Add(10 * time.Second)
		for hung.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the waiter never sent a blocking query")
			}
			time.Sleep(5 * time.Millisecond)
		}
		freed := time.Now()
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
		<-finished
		cancel()
		if gotErr != nil {
			t.Fatalf("fair=%v: the waiter: %v", fair, gotErr)
		}
		took := gotAt.Sub(freed)
		t.Logf("fair=%v: granted %v after the release, its blocking queries unanswered (bound %v)", fair, took.Round(time.Millisecond), queryBound(waitTime))
		if limit := queryBound(waitTime) + time.Second; took > limit {
			t.Errorf("fair=%v: granted %v after the release, want within %v", fair, took, limit)
		}
		if err := got.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUntilAnswered: the resend of a release whose outcome is unknown,
// timed in a bubble: a send that fails is followed by another within
// resendPause, one that goes unanswered by another every resendAfter (the
// earlier ones left outstanding, each bounded by the request timeout and
// the deadline, no more than maxOutstanding at once), and nothing is sent
// after the deadline or once the context ends.
func TestUntilAnswered(t *testing.T) {
	const timeout = time.Second
	t.Run("refused", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			var sends int
			err := untilAnsweredBy(t.Context(), start.Add(time.Minute), timeout, func(context.Context) error {
				if sends++; sends < 4 {
					return errors.New("no leader")
				}
				return nil
			})
			if err != nil || sends != 4 {
				t.Fatalf("got %v after %d sends, want nil after 4", err, sends)
			}
			if took := time.Since(start); took > 3*resendPause {
				t.Errorf("4 sends took %v, want at most 3 pauses of %v", took, resendPause)
			}
		})
	})
	t.Run("held, then answered", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// The first two sends are held (as through an election) and
			// answered late; the third is answered at once.
			start := time.Now()
			var mu sync.Mutex
			var sends []time.Duration
			err := untilAnsweredBy(t.Context(), start.Add(time.Minute), 5*time.Second, func(rctx context.Context) error {
				mu.Lock()
				sends = append(sends, time.Since(start))
				n := len(sends)
				mu.Unlock()
				if n < 3 {
					<-rctx.Done()
					return rctx.Err()
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if took, want := time.Since(start), 2*resendAfter; took != want {
				t.Errorf("answered after %v, want %v (the third send, %v apart)", took, want, resendAfter)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(sends) != 3 {
				t.Errorf("sends at %v, want 3", sends)
			}
		})
	})
	t.Run("never answered", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			deadline := start.Add(3250 * time.Millisecond)
			var sends atomic.Int32
			err := untilAnsweredBy(t.Context(), deadline, timeout, func(rctx context.Context) error {
				sends.Add(1)
				d, _ := rctx.Deadline()
				want := time.Now().Add(timeout)
				if deadline.Before(want) {
					want = deadline
				}
				if !d.Equal(want) {
					t.Errorf("send at %v bounded at %v, want %v", time.Since(start), d.Sub(start), want.Sub(start))
				}
				<-rctx.Done()
				return rctx.Err()
			})
			if err == nil {
				t.Fatal("nil after sends that all hung")
			}
			if !time.Now().Equal(deadline) {
				t.Errorf("gave up %v after the start, want at the deadline %v", time.Since(start), deadline.Sub(start))
			}
			if n, want := sends.Load(), int32(deadline.Sub(start)/resendAfter)+1; n != want {
				t.Errorf("%d sends in %v, want one every %v: %d", n, deadline.Sub(start), resendAfter, want)
			}
		})
	})
	t.Run("capped", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// The first send fails after 2 s, every other is never
			// answered: no more than maxOutstanding are outstanding at
			// any moment, and the send due meanwhile goes out as soon as
			// one returns, the first at 2 s, the second when its timeout
			// ends at 5.5 s.
			start := time.Now()
			deadline := start.Add(5750 * time.Millisecond)
			var mu sync.Mutex
			var sends []time.Duration
			outstanding, most := 0, 0
			err := untilAnsweredBy(t.Context(), deadline, 5*time.Second, func(rctx context.Context) error {
				mu.Lock()
				sends = append(sends, time.Since(start))
				n := len(sends)
				outstanding++
				most = max(most, outstanding)
				mu.Unlock()
				defer func() {
					mu.Lock()
					outstanding--
					mu.Unlock()
				}()
				if n == 1 {
					time.Sleep(2 * time.Second)
					return errors.New("no leader")
				}
				<-rctx.Done()
				return rctx.Err()
			})
			if err == nil {
				t.Fatal("nil after sends that all failed or hung")
			}
			mu.Lock()
			defer mu.Unlock()
			if most != maxOutstanding {
				t.Errorf("at most %d sends outstanding at once, want %d", most, maxOutstanding)
			}
			want := []time.Duration{0, resendAfter, 2 * resendAfter, 2 * time.Second, resendAfter + 5*time.Second}
			if !slices.Equal(sends, want) {
				t.Errorf("sends at %v, want %v", sends, want)
			}
		})
	})
	t.Run("cancelled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			start := time.Now()
			time.AfterFunc(time.Second, cancel)
			err := untilAnsweredBy(ctx, start.Add(time.Minute), timeout, func(context.Context) error { return errors.New("refused") })
			if err == nil || time.Since(start) != time.Second {
				t.Errorf("got %v after %v, want an error when cancelled after 1s", err, time.Since(start))
			}
		})
	})
}

// untilAnsweredBy is untilAnswered with its context ending at deadline, as
// a release's resend does at the session's loss deadline.
func untilAnsweredBy(ctx context.Context, deadline time.Time, timeout time.Duration, send func(context.Context) error) error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return untilAnswered(ctx, timeout, send)
}

// stubAttempt is an attempt on the lock key "k.lock" by a live session of
// a Locker whose client sends every request to rt.
func stubAttempt(t *testing.T, rt http.RoundTripper) *attempt {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address = "consul.invalid:8500"
	cfg.HttpClient = &http.Client{Transport: rt}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	s := &session{l: l, ctx: sctx, stop: stop, done: make(chan struct{}),
		leases: make(map[string]*lease), acquiring: make(map[string][]uint64), revoked: make(map[revocation]bool)}
	return &attempt{l: l, s: s, key: "k.lock"}
}

// stubConsul answers a client's requests in a bubble: blocking queries
// hang until their request ends, other reads find nothing.
type stubConsul struct {
	mu    sync.Mutex
	reads []string // the URLs of the reads, in order
}

func (sc *stubConsul) RoundTrip(r *http.Request) (*http.Response, error) {
	sc.mu.Lock()
	sc.reads = append(sc.reads, r.URL.RawQuery)
	sc.mu.Unlock()
	if r.URL.Query().Has("index") {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return &http.Response{StatusCode: http.StatusNotFound, Body: http.NoBody,
		Header: http.Header{"X-Consul-Index": {"9"}, "X-Consul-Knownleader": {"true"}, "X-Consul-Lastcontact": {"0"}}, Request: r}, nil
}

// TestBlockingQueryBound: a waiter's blocking query that gets no answer is
// given up after queryBound(waitTime), the wait plus Consul's jitter and
// queryGrace, and a consistent read (no index) follows at once.
func TestBlockingQueryBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := &stubConsul{}
		a := stubAttempt(t, sc)
		start := time.Now()
		free, _, err := a.waitFree(t.Context(), 5)
		if err != nil || free != 0 {
			t.Fatalf("waitFree: %d, %v; want the key found gone", free, err)
		}
		if took, want := time.Since(start), queryBound(waitTime); took != want {
			t.Errorf("re-checked after %v, want %v", took, want)
		}
		if want := queryBound(waitTime); want > waitTime+waitTime/16+time.Second || want < waitTime+waitTime/16 {
			t.Errorf("queryBound(%v) = %v: not just above the wait and Consul's jitter", waitTime, want)
		}
		sc.mu.Lock()
		defer sc.mu.Unlock()
		if len(sc.reads) != 2 || !strings.Contains(sc.reads[0], "index=5") || !strings.Contains(sc.reads[1], "consistent") {
			t.Errorf("reads %q, want a blocking query from index 5 and then a consistent read", sc.reads)
		}
	})
}

// scriptedConsul answers a waiter's requests in a bubble from a script,
// one step a request, and records what each request was.
type scriptedConsul struct {
	mu      sync.Mutex
	sent    []string    // "txn", "read", or "query <index> <wait>"
	at      []time.Time // when each was sent
	steps   []func(*http.Request) (*http.Response, error)
	drained chan struct{} // closed at the first request past the script
}

func (sc *scriptedConsul) RoundTrip(r *http.Request) (*http.Response, error) {
	what := "read"
	q := r.URL.Query()
	switch {
	case strings.HasSuffix(r.URL.Path, "/txn"):
		what = "txn"
	case q.Has("index"):
		what = "query " + q.Get("index") + " " + q.Get("wait")
	}
	sc.mu.Lock()
	sc.sent = append(sc.sent, what)
	sc.at = append(sc.at, time.Now())
	step := len(sc.sent) - 1
	sc.mu.Unlock()
	if step >= len(sc.steps) {
		if step == len(sc.steps) {
			close(sc.drained)
		}
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return sc.steps[step](r)
}

// consulAnswer is an answer of Consul's with index, and body as JSON.
func consulAnswer(r *http.Request, status int, index, body string) (*http.Response, error) {
	return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader(body)),
		Header: http.Header{"X-Consul-Index": {index}, "X-Consul-Knownleader": {"true"}, "X-Consul-Lastcontact": {"0"}}, Request: r}, nil
}

// TestWaiterYieldsToBarger: a waiter that is not fair and loses an attempt
// sleeps for yieldFor, sending nothing (no query on the key, which a
// releaser asking again changes twice a cycle), then waits for the key to
// be free and attempts at every release, without yielding again. A fair
// waiter never yields. A waiter whose session ends while it sleeps stops
// at once.
func TestWaiterYieldsToBarger(t *testing.T) {
	lost := func(r *http.Request) (*http.Response, error) {
		return consulAnswer(r, http.StatusConflict, "0",
			`{"Errors":[{"OpIndex":0,"What":"key exists"},{"OpIndex":1,"What":"failed to lock key \"k.lock\", lock is already held"}]}`)
	}
	gone := func(index string) func(*http.Request) (*http.Response, error) {
		return func(r *http.Request) (*http.Response, error) { return consulAnswer(r, http.StatusNotFound, index, "") }
	}
	held := func(index string) func(*http.Request) (*http.Response, error) {
		return func(r *http.Request) (*http.Response, error) {
			return consulAnswer(r, http.StatusOK, index,
				`[{"Key":"k.lock","Session":"other","CreateIndex":`+index+`,"ModifyIndex":`+index+`,"LockIndex":1}]`)
		}
	}
	for _, tc := range []struct {
		fair  bool
		steps []func(*http.Request) (*http.Response, error)
		want  []string
		// the gaps between the requests, each a multiple of yieldFor
		gaps []time.Duration
	}{{
		steps: []func(*http.Request) (*http.Response, error){
			lost,                   // lost: yield
			held("11"), gone("12"), // then wait for the key to be free
			lost,       // lost again: no second yield
			gone("13"), // free: attempt at once
			lost,
		},
		want: []string{"txn", "read", "query 11 1000ms", "txn", "read", "txn"},
		gaps: []time.Duration{yieldFor, 0, 0, 0, 0},
	}, {
		fair:  true,
		steps: []func(*http.Request) (*http.Response, error){lost, gone("10"), lost},
		want:  []string{"txn", "read", "txn"},
		gaps:  []time.Duration{0, 0},
	}} {
		synctest.Test(t, func(t *testing.T) {
			sc := &scriptedConsul{steps: tc.steps, drained: make(chan struct{})}
			a := stubAttempt(t, sc)
			a.fair = tc.fair
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				_, err := a.take(ctx, true, "", nil)
				done <- err
			}()
			<-sc.drained
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("take: %v, want context.Canceled", err)
			}
			sc.mu.Lock()
			defer sc.mu.Unlock()
			if got := sc.sent[:min(len(sc.sent), len(tc.want))]; !slices.Equal(got, tc.want) {
				t.Fatalf("fair=%v: sent %q, want %q", tc.fair, sc.sent, tc.want)
			}
			for i, want := range tc.gaps {
				if gap := sc.at[i+1].Sub(sc.at[i]); gap != want {
					t.Errorf("fair=%v: %v between request %d (%s) and the next, want %v", tc.fair, gap, i, sc.sent[i], want)
				}
			}
		})
	}
	t.Run("session ends", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			sc := &scriptedConsul{steps: []func(*http.Request) (*http.Response, error){lost}, drained: make(chan struct{})}
			a := stubAttempt(t, sc)
			done := make(chan error, 1)
			go func() {
				_, err := a.take(t.Context(), true, "", nil)
				done <- err
			}()
			time.Sleep(yieldFor / 2)
			start := time.Now()
			close(a.s.done)
			if err := <-done; !errors.Is(err, errSessionLost) {
				t.Errorf("take: %v, want errSessionLost", err)
			}
			if waited := time.Since(start); waited != 0 {
				t.Errorf("take returned %v after the session ended, want at once", waited)
			}
			if len(sc.sent) != 1 {
				t.Errorf("sent %q, want the one attempt", sc.sent)
			}
		})
	})
}

// slowAnchor delays the acquisition of a session's anchor.
type slowAnchor struct {
	base  http.RoundTripper
	delay time.Duration
}

func (s slowAnchor) RoundTrip(r *http.Request) (*http.Response, error) {
	if anchorAcquisition(r) {
		time.Sleep(s.delay)
	}
	return s.base.RoundTrip(r)
}

// A slow anchor (6 s, within a 10 s request timeout) does not cost the
// session its lock: its first renewal is due a third of the TTL after the
// creation, as its Expiry counts, where it came that long after the
// anchor, past the loss deadline, and the session was declared lost with
// nothing failing.
func TestSlowAnchorKeepsTheSession(t *testing.T) {
	cfg := api.DefaultConfig()
	cfg.Address = addr(t)
	cfg.HttpClient = &http.Client{Transport: slowAnchor{cfg.Transport, 6 * time.Second}}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := lockerOn(t, c, WithRequestTimeout(10*time.Second))
	ctx := context.Background()
	le, err := l.Acquire(ctx, name("slow-anchor"), driver.AcquireOptions{TTL: MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	s := le.(*lease).s
	// Renewed once its Expiry is past the creation's TTL.
	for deadline := time.Now().Add(MinTTL); !s.Expiry().After(s.born.Add(MinTTL)); time.Sleep(10 * time.Millisecond) {
		select {
		case <-s.Done():
			t.Fatalf("session declared lost %v after its creation, with nothing failing", time.Since(s.born).Round(time.Millisecond))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no renewal within a TTL of the grant")
		}
	}
}

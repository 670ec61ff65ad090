package httpmw_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/httpmw"
)

const patience = 30 * time.Second

func newGuard(t *testing.T, l driver.Locker, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g, err := guard.New(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// byUser locks per user, named in the path: /users/{id}/...
func byUser(r *http.Request) string {
	parts := strings.Split(r.URL.Path, "/")
	if len(parts) < 3 || parts[1] != "users" {
		return ""
	}
	return "user/" + parts[2]
}

// lockMiddleware is httpmw.Lock, which must accept its configuration.
func lockMiddleware(t *testing.T, g *guard.Guard, key func(*http.Request) string, opts ...httpmw.LockOption) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := httpmw.Lock(g, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

func lockServer(t *testing.T, g *guard.Guard, h http.Handler, opts ...httpmw.LockOption) string {
	t.Helper()
	srv := httptest.NewServer(lockMiddleware(t, g, byUser, opts...)(h))
	t.Cleanup(srv.Close)
	return srv.URL
}

func post(t *testing.T, url string) (*http.Response, string, error) {
	resp, err := http.Post(url, "text/plain", nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// TestLockSerialises: requests for one user, over two servers sharing the
// backend, never overlap; requests for another user are not held up.
func TestLockSerialises(t *testing.T) {
	backend := memory.New()
	var inside, maxInside, runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inside.Add(1)
		for {
			m := maxInside.Load()
			if n <= m || maxInside.CompareAndSwap(m, n) {
				break
			}
		}
		runs.Add(1)
		time.Sleep(time.Millisecond) // widen the window an overlap would show in
		inside.Add(-1)
	})
	urls := []string{
		lockServer(t, newGuard(t, backend), h, httpmw.WithLockWait(patience)),
		lockServer(t, newGuard(t, backend), h, httpmw.WithLockWait(patience)),
	}
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			resp, body, err := post(t, urls[i%2]+"/users/42/orders")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: %v %v %q", i, err, resp, body)
			}
		})
	}
	wg.Wait()
	if maxInside.Load() != 1 || runs.Load() != 24 {
		t.Errorf("%d runs, at most %d at once; want 24, one at a time", runs.Load(), maxInside.Load())
	}
}

func TestLockBusy(t *testing.T) {
	g := newGuard(t, memory.New())
	entered := make(chan struct{})
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			close(entered)
			<-release
		}
		io.WriteString(w, "ok")
	})
	url := lockServer(t, g, h, httpmw.WithLockWait(20*time.Millisecond))
	locked := lockServer(t, g, h, httpmw.WithLockWait(0), httpmw.WithLockedStatus())
	held := make(chan error, 1)
	go func() {
		_, _, err := post(t, url+"/users/1/pay?hold=1")
		held <- err
	}()
	<-entered
	for _, tc := range []struct {
		url    string
		status int
	}{{url, http.StatusConflict}, {locked, http.StatusLocked}} {
		resp, body, err := post(t, tc.url+"/users/1/pay")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/problem+json" || resp.Header.Get("Retry-After") == "" {
			t.Errorf("busy key: %d %v %q, want %d problem+json with Retry-After", resp.StatusCode, resp.Header, body, tc.status)
		}
	}
	// Another user, and a request with no key, are not held up.
	for _, path := range []string{"/users/2/pay", "/health"} {
		if resp, body, err := post(t, url+path); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("%s while user 1 is locked: %v %v %q", path, err, resp, body)
		}
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if resp, _, err := post(t, url+"/users/1/pay"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("after release: %v %v", err, resp)
	}
}

// losing is a backend whose leases are lost at their first refresh, as when
// the server was partitioned from the lock service.
type losing struct{ driver.Locker }

func (l losing) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, key, o)
	if err != nil {
		return nil, err
	}
	return lostLease{lease}, nil
}

type lostLease struct{ driver.Lease }

func (lostLease) Refresh(context.Context, time.Duration) error { return driver.ErrNotHeld }

func TestLockLostCancelsHandler(t *testing.T) {
	g := newGuard(t, losing{memory.New()}, guard.WithTTL(300*time.Millisecond))
	cause := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			cause <- context.Cause(r.Context())
		case <-time.After(patience):
			cause <- errors.New("the handler's context was never cancelled")
		}
	})
	url := lockServer(t, g, h)
	if _, _, err := post(t, url+"/users/1/pay"); err != nil {
		t.Fatal(err)
	}
	if err := <-cause; !errors.Is(err, guard.ErrLockLost) {
		t.Errorf("handler's context cause %v, want ErrLockLost", err)
	}
}

func TestLockReleasedOnPanic(t *testing.T) {
	g := newGuard(t, memory.New())
	var runs atomic.Int64
	inner := lockMiddleware(t, g, byUser, httpmw.WithLockWait(0))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("handler bug")
		}
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	for i, want := range []int{http.StatusInternalServerError, http.StatusOK} {
		if resp, _, err := post(t, srv.URL+"/users/1/pay"); err != nil || resp.StatusCode != want {
			t.Errorf("request %d: %v %v, want %d", i, err, resp, want)
		}
	}
}

// TestInvalidLockKeyIsNotEchoed: a lock key the Guard refuses is the
// service's internal naming; the problem document must not show it.
func TestInvalidLockKeyIsNotEchoed(t *testing.T) {
	g := newGuard(t, memory.New())
	srv := httptest.NewServer(lockMiddleware(t, g, func(*http.Request) string { return "tenant-secret-42\x01" })(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran under an invalid key") })))
	t.Cleanup(srv.Close)
	resp, body, err := post(t, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(body, "tenant-secret") || !strings.Contains(body, "Invalid lock key") {
		t.Fatalf("%d %s: want 400 without the key", resp.StatusCode, body)
	}
}

// TestLockRefusesBadConfiguration: a nil Guard, key function or option, and
// a negative Retry-After, are refused when the middleware is built, not
// found on the first request.
func TestLockRefusesBadConfiguration(t *testing.T) {
	g := newGuard(t, memory.New())
	for name, build := range map[string]func() (func(http.Handler) http.Handler, error){
		"nil guard":  func() (func(http.Handler) http.Handler, error) { return httpmw.Lock(nil, byUser) },
		"nil key":    func() (func(http.Handler) http.Handler, error) { return httpmw.Lock(g, nil) },
		"nil option": func() (func(http.Handler) http.Handler, error) { return httpmw.Lock(g, byUser, nil) },
		"nil guard option": func() (func(http.Handler) http.Handler, error) {
			return httpmw.Lock(g, byUser, httpmw.WithGuardOptions(nil))
		},
		"negative retry": func() (func(http.Handler) http.Handler, error) {
			return httpmw.Lock(g, byUser, httpmw.WithLockRetryAfter(-time.Second))
		},
		// Refused now, not answered 503 "Lock unavailable" at every request.
		"negative guard TTL": func() (func(http.Handler) http.Handler, error) {
			return httpmw.Lock(g, byUser, httpmw.WithGuardOptions(guard.TTL(-time.Second)))
		},
		"no permits": func() (func(http.Handler) http.Handler, error) {
			return httpmw.Lock(g, byUser, httpmw.WithGuardOptions(guard.Permits(0)))
		},
	} {
		mw, err := build()
		if !errors.Is(err, guard.ErrInvalidOption) || mw != nil {
			t.Errorf("%s: %v, want an error wrapping ErrInvalidOption and no middleware", name, err)
		}
	}
}

// unreachable is a lock backend that cannot be reached: every attempt fails
// with ErrUnavailable, and a waiting one retries until its context ends,
// as the backends do.
type unreachable struct{}

func (unreachable) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	for o.Wait {
		if err := driver.Sleep(ctx, 50*time.Millisecond, nil); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: connection refused", driver.ErrUnavailable)
}

// TestLockUnavailableIs503: a backend that cannot be reached is answered 503
// "Lock unavailable" when the wait runs out, as the docs promise, not 409
// "Resource busy", and within the wait.
func TestLockUnavailableIs503(t *testing.T) {
	g := newGuard(t, unreachable{})
	wait := 500 * time.Millisecond
	url := lockServer(t, g, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran without its lock")
	}), httpmw.WithLockWait(wait))
	start := time.Now()
	resp, body, err := post(t, url+"/users/1/pay")
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "Lock_unavailable") || resp.Header.Get("Retry-After") == "" {
		t.Errorf("backend unreachable: %d %q, want 503 Lock unavailable with Retry-After", resp.StatusCode, body)
	}
	if took > wait+patience/10 {
		t.Errorf("answered after %v with a %v wait", took, wait)
	}
}

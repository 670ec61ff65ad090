package consullock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

const addrEnv = "WARDEN_CONSUL_ADDR"

// testPrefix keeps this package's own keys apart from other users of the
// shared agent, as guard's prefix would.
const testPrefix = "warden-test/consullock/"

// addr returns the shared test agent's HTTP address, or skips (fails with
// WARDEN_REQUIRE_SERVERS=1) when it is not running.
func addr(t testing.TB) string {
	t.Helper()
	return drivertest.Addr(t, addrEnv, "127.0.0.1:18500")
}

// newClient returns a client of its own to address a.
func newClient(t testing.TB, a string) *api.Client {
	t.Helper()
	// DefaultConfig gives every client a transport, and a connection
	// pool, of its own, as a separate process would have.
	cfg := api.DefaultConfig()
	cfg.Address = a
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatalf("consul client: %v", err)
	}
	// The agent refuses more than 200 connections from one address
	// (limits.http_max_conns_per_client): the idle ones go with the test.
	t.Cleanup(cfg.Transport.CloseIdleConnections)
	return c
}

// clientThrough returns a client of its own to address a, with token,
// whose requests go through the round tripper wrap makes of its transport.
func clientThrough(t testing.TB, a, token string, wrap func(base http.RoundTripper) http.RoundTripper) *api.Client {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Token = a, token
	cfg.HttpClient = &http.Client{Transport: wrap(cfg.Transport)}
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatalf("consul client: %v", err)
	}
	t.Cleanup(cfg.Transport.CloseIdleConnections)
	return c
}

func lockerOn(t testing.TB, c *api.Client, opts ...Option) *Locker {
	t.Helper()
	l, err := New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// name returns a lock name no earlier run used, under testPrefix.
func name(what string) string {
	return fmt.Sprintf("%s%s/%d", testPrefix, what, time.Now().UnixNano())
}

// queued counts the fair waiters of lock key.
func queued(t testing.TB, c *api.Client, key string) int {
	t.Helper()
	keys, _, err := c.KV().Keys(queueDir(LockKey(key)), "", nil)
	if err != nil {
		t.Fatalf("listing the queue of %q: %v", key, err)
	}
	return len(keys)
}

func TestConformance(t *testing.T) {
	a := addr(t)
	observer := lockerOn(t, newClient(t, a))
	var (
		mu      sync.Mutex
		proxies = map[driver.Locker]*drivertest.Proxy{}
	)
	drivertest.Run(t, drivertest.Backend{
		// Every Locker goes through a proxy of its own, so that Abandon can
		// cut it off as a crash would: its session then expires on the
		// server, which Close (it destroys the session at once) would not
		// show.
		NewLocker: func(t testing.TB) driver.Locker {
			p := drivertest.StartProxy(t, a)
			l := lockerOn(t, newClient(t, p.Addr()))
			mu.Lock()
			proxies[l] = p
			mu.Unlock()
			return l
		},
		TTL: MinTTL,
		Abandon: func(t testing.TB, l driver.Locker) {
			mu.Lock()
			defer mu.Unlock()
			proxies[l].Cut()
		},
		FIFO: true,
		Waiters: func(t testing.TB, key string) int {
			in, err := observer.Inspect(context.Background(), key)
			if err != nil {
				t.Fatalf("Inspect(%q): %v", key, err)
			}
			return in.Waiters
		},
	})
}

func TestLimits(t *testing.T) {
	l, err := New(newClient(t, "127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lim := driver.LimitsOf(l)
	for _, ttl := range []time.Duration{time.Second, MinTTL - time.Millisecond, MaxTTL + time.Second} {
		if err := lim.CheckTTL(ttl); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("CheckTTL(%v): got %v, want ErrInvalidOption", ttl, err)
		}
	}
	for _, ttl := range []time.Duration{MinTTL, 15500 * time.Millisecond, time.Hour, MaxTTL} {
		if err := lim.CheckTTL(ttl); err != nil {
			t.Errorf("CheckTTL(%v): %v", ttl, err)
		}
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("New(nil): got %v, want ErrInvalidOption", err)
	}
	c := newClient(t, "127.0.0.1:1")
	for _, o := range []Option{nil, WithRequestTimeout(0), WithRequestTimeout(-time.Second)} {
		if _, err := New(c, o); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("New with a bad option: got %v, want ErrInvalidOption", err)
		}
	}
}

// TestSessionSettings: the session has the TTL asked for, deletes its keys
// when it ends, has no health checks and no lock-delay (the package
// documentation says why); the client's own Create would have sent neither
// of the last two.
func TestSessionSettings(t *testing.T) {
	c := newClient(t, addr(t))
	l := lockerOn(t, c)
	ctx := context.Background()
	le, err := l.Acquire(ctx, name("session"), driver.AcquireOptions{TTL: 12 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	s := le.(*lease).s
	info, _, err := c.Session().Info(s.id, nil)
	if err != nil || info == nil {
		t.Fatalf("session info: %+v, %v", info, err)
	}
	if info.TTL != "12s" || info.Behavior != api.SessionBehaviorDelete || info.LockDelay != 0 ||
		len(info.NodeChecks) != 0 || len(info.ServiceChecks) != 0 || len(info.Checks) != 0 {
		t.Fatalf("session %+v: want TTL 12s, Behavior delete, LockDelay 0, no checks", info)
	}
}

// TestTokenIsModifyIndex: the token is the lock key's ModifyIndex as the
// server has it, and Refresh checks the holding with one read.
func TestTokenIsModifyIndex(t *testing.T) {
	c := newClient(t, addr(t))
	l := lockerOn(t, c)
	ctx := context.Background()
	k := name("token")
	le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL, Owner: "me"})
	if err != nil {
		t.Fatal(err)
	}
	kv, _, err := c.KV().Get(LockKey(k), nil)
	if err != nil || kv == nil {
		t.Fatalf("lock key: %+v, %v", kv, err)
	}
	if kv.ModifyIndex != le.Token() || string(kv.Value) != "me" || kv.Session != le.(*lease).s.id {
		t.Fatalf("lock key %+v, want ModifyIndex %d, value me and the holder's session", kv, le.Token())
	}
	if err := le.Refresh(ctx, MinTTL+time.Second); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("Refresh with another TTL: got %v, want ErrInvalidOption", err)
	}
	if err := le.Refresh(ctx, MinTTL); err != nil {
		t.Errorf("Refresh: %v", err)
	}
	if _, err := c.KV().Delete(LockKey(k), nil); err != nil {
		t.Fatal(err)
	}
	if err := le.Refresh(ctx, MinTTL); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Refresh after the key was deleted: got %v, want ErrNotHeld", err)
	}
	if err := le.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release after the key was deleted: got %v, want ErrNotHeld", err)
	}
}

// TestReleaseLeavesNothing: a released lock, and a fair waiter that gave
// up, leave no key behind.
func TestReleaseLeavesNothing(t *testing.T) {
	c := newClient(t, addr(t))
	l1, l2 := lockerOn(t, c), lockerOn(t, newClient(t, addr(t)))
	ctx := context.Background()
	k := name("leaves")
	le, err := l1.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l2.Acquire(wctx, k, driver.AcquireOptions{TTL: MinTTL, Wait: true, Fair: true})
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for queued(t, c, k) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the fair waiter never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	keys, _, err := c.KV().Keys(LockKey(k), "", nil)
	if err != nil || len(keys) != 0 {
		t.Fatalf("keys left after release: %q, %v", keys, err)
	}
}

func TestPing(t *testing.T) {
	a := addr(t)
	p := drivertest.StartProxy(t, a)
	cut := lockerOn(t, newClient(t, p.Addr()))
	p.Blackhole()
	drivertest.CheckPing(t, lockerOn(t, newClient(t, a)), cut)
}

// TestNameOf: every key a name's locks use leads back to that name, and no
// other key does, whatever suffix the name itself ends with.
func TestNameOf(t *testing.T) {
	for _, n := range []string{"a", "a.lock", "a.rw", "a.sem", "a/b c", "é"} {
		for _, k := range []string{LockKey(n), queueDir(LockKey(n)) + "s-1", RWDir(n) + "s-2", SemaphoreDir(n) + "s-3"} {
			if got, ok := nameOf(k); !ok || got != n {
				t.Errorf("nameOf(%q) = %q, %v; want %q", k, got, ok, n)
			}
		}
	}
	for _, k := range []string{"a", "a.rw", "a.rw/", "a.sem", "a%2fb.lock", RevokedPrefix + "s/a.lock/7", "a/b.lock"} {
		if got, ok := nameOf(k); ok {
			t.Errorf("nameOf(%q) = %q, want no name", k, got)
		}
	}
}

// TestDotNames: the locks named "." and "..", whose escapes are a URL
// path's dot segments, are inspected, listed and force-released like any
// other. Both names are the same for every run, so each run waits for the
// lock, and looks only for its own label.
func TestDotNames(t *testing.T) {
	l := lockerOn(t, newClient(t, addr(t)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner := fmt.Sprintf("dots-%d", time.Now().UnixNano())
	for _, k := range []string{".", ".."} {
		le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL, Owner: owner, Wait: true})
		if err != nil {
			t.Fatalf("%q: %v", k, err)
		}
		mine := driver.Holding{Owner: owner, Token: le.Token(), SessionBound: true}
		if in, err := l.Inspect(ctx, k); err != nil || !slices.Equal(in.Holders, []driver.Holding{mine}) {
			t.Errorf("Inspect(%q) = %+v, %v; want the holder %+v", k, in, err, mine)
		}
		ls, err := l.List(ctx, k, "", 1)
		if err != nil || len(ls) != 1 || ls[0].Key != k || !slices.Equal(ls[0].Holders, []driver.Holding{mine}) {
			t.Errorf("List(%q) = %+v, %v; want %q held by %+v", k, ls, err, k, mine)
		}
		removed, err := l.ForceRelease(ctx, k, driver.ReleaseTarget{Token: le.Token(), Owner: owner})
		if err != nil || !slices.Equal(removed, []driver.Holding{mine}) {
			t.Errorf("ForceRelease(%q) = %+v, %v; want %+v removed", k, removed, err, mine)
		}
		if err := le.Release(ctx); err == nil && len(removed) == 1 {
			t.Errorf("Release(%q) after ForceRelease: nil", k)
		}
	}
}

// TestDotListReadsItsKeysAlone: List of the prefixes "." and "..", which
// a URL cannot name, reads the values of the keys under them alone, not
// the whole store's: the client reads less for each than the store's key
// names and the values of keys written elsewhere, and lists a name of its
// own under each. Each read the whole store.
func TestDotListReadsItsKeysAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := addr(t)
	root := newClient(t, a)
	elsewhere := name("elsewhere") + "/"
	const keys, size = 64, 16 << 10
	for i := range keys {
		if _, err := root.KV().Put(&api.KVPair{Key: elsewhere + strconv.Itoa(i), Value: bytes.Repeat([]byte{'x'}, size)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { root.KV().DeleteTree(elsewhere, nil) })
	var read atomic.Int64
	l := lockerOn(t, clientThrough(t, a, "", func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := base.RoundTrip(r)
			if err == nil {
				resp.Body = countedBody{resp.Body, &read}
			}
			return resp, err
		})
	}))
	for _, prefix := range []string{".", ".."} {
		k := prefix + name("dots")
		if _, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL}); err != nil {
			t.Fatal(err)
		}
		names := storeNames(t, a)
		before := read.Load()
		page, err := l.List(ctx, prefix, "", 1000)
		n := read.Load() - before
		t.Logf("List(%q): %d bytes read, the store's names %d bytes", prefix, n, names)
		if n >= names+keys*size/2 {
			t.Errorf("List(%q): %d bytes read, with %d bytes of values elsewhere and %d of names; want the values under %[1]q alone", prefix, n, keys*size, names)
		}
		if err != nil || !slices.ContainsFunc(page, func(e driver.Listed) bool { return e.Key == k && len(e.Holders) == 1 }) {
			t.Errorf("List(%q) = %+v, %v; want %q held", prefix, page, err, k)
		}
	}
}

// storeNames is the size of the answer to a listing of every key name in
// the store of the agent at a.
func storeNames(t *testing.T, a string) int64 {
	t.Helper()
	resp, err := http.Get("http://" + a + "/v1/kv/?keys")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// countedBody adds the bytes read from a response's body to n.
type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestForceReleaseManyHolders: a forced release of every holder of a
// semaphore removes them all, past the 128 operations Consul takes in one
// transaction (three per holding).
func TestForceReleaseManyHolders(t *testing.T) {
	l := lockerOn(t, newClient(t, addr(t)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := name("many")
	const n = 2*maxForced + 1
	var want []driver.Holding
	for range n {
		le, err := l.AcquireSemaphore(ctx, k, n, driver.AcquireOptions{TTL: MinTTL, Owner: "me"})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, driver.Holding{Owner: "me", Token: le.Token(), SessionBound: true})
	}
	removed, err := l.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true})
	if err != nil || !slices.Equal(removed, want) {
		t.Fatalf("ForceRelease: %d removed, %v; want the %d holders", len(removed), err, n)
	}
	if in, err := l.Inspect(ctx, k); err != nil || len(in.Holders) != 0 || in.Waiters != 0 {
		t.Errorf("after ForceRelease: %+v, %v; want no holder", in, err)
	}
}

// TestSemaphorePermitsBound: a semaphore of more permits than a contender
// key's Flags hold is refused; Inspect read one of 1<<56 permits as 0, and
// reported its holder as a waiter.
func TestSemaphorePermitsBound(t *testing.T) {
	l := lockerOn(t, newClient(t, addr(t)))
	ctx := context.Background()
	for _, permits := range []int{maxPermits + 1, 1 << 57, math.MaxInt} {
		if le, err := l.AcquireSemaphore(ctx, name("permits"), permits, driver.AcquireOptions{TTL: MinTTL}); le != nil || !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%d permits: %v; want ErrInvalidOption", permits, err)
		}
	}
	k := name("permits")
	le, err := l.AcquireSemaphore(ctx, k, maxPermits, driver.AcquireOptions{TTL: MinTTL, Owner: "me"})
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	want := []driver.Holding{{Owner: "me", Token: le.Token(), SessionBound: true}}
	if in, err := l.Inspect(ctx, k); err != nil || !slices.Equal(in.Holders, want) || in.Waiters != 0 {
		t.Errorf("Inspect: %+v, %v; want %+v", in, err, want)
	}
}

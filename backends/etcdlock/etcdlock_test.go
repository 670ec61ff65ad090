package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

const endpointsEnv = "WARDEN_ETCD_ENDPOINTS"

// testPrefix keeps this package's keys apart from other users of the shared
// server, as guard's prefix would.
const testPrefix = "warden-test/etcdlock/"

// endpoints returns the shared test server's endpoints, or skips (fails with
// WARDEN_REQUIRE_SERVERS=1) when it is not running.
func endpoints(t testing.TB) []string {
	t.Helper()
	return strings.Split(drivertest.Addr(t, endpointsEnv, "127.0.0.1:12379"), ",")
}

// newClient returns a client of its own to eps, closed at cleanup.
func newClient(t testing.TB, eps []string, dial ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: dial})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newLocker returns a Locker on a client of its own, as a separate process
// would have, closed at cleanup.
func newLocker(t testing.TB, eps []string, opts ...Option) (*Locker, *clientv3.Client) {
	t.Helper()
	c := newClient(t, eps)
	return lockerOn(t, c, opts...), c
}

func lockerOn(t testing.TB, c *clientv3.Client, opts ...Option) *Locker {
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

// keysUnder lists the contender keys of lock name.
func keysUnder(t testing.TB, c *clientv3.Client, name string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, KeyDir(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("listing keys: %v", err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

func opts(ttl time.Duration, wait bool) driver.AcquireOptions {
	return driver.AcquireOptions{TTL: ttl, Wait: wait}
}

func TestConformance(t *testing.T) {
	eps := endpoints(t)
	probe := newClient(t, eps)
	drivertest.Run(t, drivertest.Backend{
		NewLocker: func(t testing.TB) driver.Locker {
			l, _ := newLocker(t, eps)
			return l
		},
		TTL: MinTTL,
		Abandon: func(t testing.TB, l driver.Locker) {
			// As a crashed process: the keepalive stops, nothing is revoked.
			l.(*Locker).client.Close()
		},
		FIFO: true,
		Waiters: func(t testing.TB, key string) int {
			return max(len(keysUnder(t, probe, key))-1, 0)
		},
		Silence: func(t testing.TB) (driver.Locker, func()) {
			p := drivertest.StartProxy(t, eps[0])
			l, _ := newLocker(t, []string{p.Addr()})
			// The silence ends first at cleanup, so that the Locker's
			// Close revokes its session at once.
			t.Cleanup(p.Reset)
			return l, p.Blackhole
		},
	})
}

func TestLimits(t *testing.T) {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lim := driver.LimitsOf(l)
	for _, ttl := range []time.Duration{time.Second, 500 * time.Millisecond, 2500 * time.Millisecond} {
		if err := lim.CheckTTL(ttl); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("CheckTTL(%v): got %v, want ErrInvalidOption", ttl, err)
		}
	}
	for _, ttl := range []time.Duration{MinTTL, 3 * time.Second, time.Hour} {
		if err := lim.CheckTTL(ttl); err != nil {
			t.Errorf("CheckTTL(%v): %v", ttl, err)
		}
	}
}

// TestRefreshChecksOwnership: Refresh renews nothing, but tells whether the
// lease still holds its key, and refuses a TTL the session cannot have.
func TestRefreshChecksOwnership(t *testing.T) {
	eps := endpoints(t)
	l, c := newLocker(t, eps)
	ctx := context.Background()
	k := name("refresh")
	held, err := l.Acquire(ctx, k, opts(3*time.Second, false))
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Refresh(ctx, 4*time.Second); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("Refresh with another TTL: got %v, want ErrInvalidOption", err)
	}
	if err := held.Refresh(ctx, 3*time.Second); err != nil {
		t.Errorf("Refresh: %v", err)
	}
	// Someone deletes the key behind the holder's back.
	if _, err := c.Delete(ctx, held.(*lease).key()); err != nil {
		t.Fatal(err)
	}
	if err := held.Refresh(ctx, 3*time.Second); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Refresh of a deleted key: got %v, want ErrNotHeld", err)
	}
	if err := held.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release of a deleted key: got %v, want ErrNotHeld", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("New(nil): got %v, want ErrInvalidOption", err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, o := range []Option{WithRequestTimeout(0), WithRequestTimeout(-time.Second), nil} {
		if _, err := New(c, o); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("New with a bad option: got %v, want ErrInvalidOption", err)
		}
	}
	l, err := New(c, WithRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.AcquireSemaphore(context.Background(), "k", 0, opts(MinTTL, false)); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("0 permits: got %v, want ErrInvalidOption", err)
	}
}

func TestCloseReleases(t *testing.T) {
	eps := endpoints(t)
	l, _ := newLocker(t, eps)
	other, _ := newLocker(t, eps)
	ctx := context.Background()
	k := name("close")
	lease, err := l.Acquire(ctx, k, opts(60*time.Second, false))
	if err != nil {
		t.Fatal(err)
	}
	sess := lease.(driver.SessionLease).Session()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-sess.Done():
	default:
		t.Error("Done is still open after Close")
	}
	if !sess.Expiry().Before(time.Now()) {
		t.Errorf("Expiry %v of a closed session is not in the past", sess.Expiry())
	}
	// The lease was revoked: the lock is free at once, not after 60 s.
	next, err := other.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatalf("Acquire after the holder closed: %v", err)
	}
	next.Release(ctx)
	if _, err := l.Acquire(ctx, k, opts(MinTTL, false)); !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("Acquire on a closed Locker: got %v, want ErrUnavailable", err)
	}
}

// TestSessionShared: every lease of one TTL shares one session, whose
// Expiry moves with the keepalive.
func TestSessionShared(t *testing.T) {
	eps := endpoints(t)
	l, _ := newLocker(t, eps)
	ctx := context.Background()
	k := name("shared")
	a, err := l.Acquire(ctx, k+"/a", opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := l.AcquireRead(ctx, k+"/b", opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	sa, sb := a.(driver.SessionLease).Session(), b.(driver.SessionLease).Session()
	if sa != sb {
		t.Fatal("two leases of one TTL have different sessions")
	}
	first := sa.Expiry()
	if d := time.Until(first); d <= 0 || d > MinTTL {
		t.Errorf("a fresh session's Expiry is %v away, want within (0, %v]", d, MinTTL)
	}
	deadline := time.Now().Add(3 * MinTTL)
	for !sa.Expiry().After(first) {
		if time.Now().After(deadline) {
			t.Fatal("the session's Expiry did not move: no keepalive was answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !a.Expiry().After(first) {
		t.Errorf("lease Expiry %v did not follow its session's", a.Expiry())
	}
}

// TestNestedNames checks that a '/' in a name cannot put one lock's keys
// inside another's.
func TestNestedNames(t *testing.T) {
	eps := endpoints(t)
	l1, _ := newLocker(t, eps)
	l2, _ := newLocker(t, eps)
	ctx := context.Background()
	k := name("nested")
	o := opts(MinTTL, false)
	for _, inner := range []string{k + "/r/inner", k + ".lock/r", k + ".lock"} {
		held, err := l1.Acquire(ctx, inner, o)
		if err != nil {
			t.Fatal(err)
		}
		outer, err := l2.Acquire(ctx, k, o)
		if err != nil {
			t.Fatalf("lock %q is blocked by lock %q: %v", k, inner, err)
		}
		outer.Release(ctx)
		reader, err := l2.AcquireRead(ctx, k+"/r", o)
		if err != nil {
			t.Fatalf("reader of %q is blocked by lock %q: %v", k+"/r", inner, err)
		}
		reader.Release(ctx)
		held.Release(ctx)
	}
}

// TestClientClosedEndsSessions: closing the client under a Locker that
// holds a lock (a process shutting down in the wrong order) ends its
// session within the TTL, and nothing of it runs on: the revocation it
// would send has nowhere to go.
func TestClientClosedEndsSessions(t *testing.T) {
	l, c := newLocker(t, endpoints(t))
	le, err := l.Acquire(context.Background(), name("client-closed"), opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	s := le.(*lease).s
	c.Close()
	waitFor(t, "the session has exited", s.exitedYet)
}

// TestOverlongName: a lock name too long for a put to be sent (over the
// client's send limit, 64 KiB here, 2 MiB by default) or taken (over the
// member's request limit, 1.5 MiB by default) fails at once, waiting or
// not, and the session's other locks are kept: the put was not applied.
// The client's refusal gave the session up, as a put whose outcome is
// unknown does, and a waiting acquisition tried again, refused again and
// again, until its context ended.
func TestOverlongName(t *testing.T) {
	for _, tc := range []struct {
		what      string
		sendLimit int
		nameLen   int
	}{
		{"the client's", 64 << 10, 32 << 10},
		{"the member's", 0, 600 << 10},
	} {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints(t), MaxCallSendMsgSize: tc.sendLimit, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		l := lockerOn(t, c)
		ctx := context.Background()
		held, err := l.Acquire(ctx, name("overlong-held"), opts(MinTTL, false))
		if err != nil {
			t.Fatal(err)
		}
		for _, wait := range []bool{false, true} {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := l.Acquire(wctx, name("overlong-")+strings.Repeat("n", tc.nameLen), opts(MinTTL, wait))
			cancel()
			if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, driver.ErrNotAcquired) {
				t.Errorf("%s limit, wait=%v: got %v, want a refusal", tc.what, wait, err)
			}
			// Given up, the session is lost at once; its Done closes
			// once its keepalive has stopped.
			if held.(*lease).s.lost() {
				t.Errorf("%s limit, wait=%v: the session holding another lock ended", tc.what, wait)
				break
			}
		}
		if err := held.Release(ctx); err != nil {
			t.Errorf("%s limit: release of the lock held meanwhile: %v", tc.what, err)
		}
	}
}

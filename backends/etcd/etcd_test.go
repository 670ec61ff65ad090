package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/warden-go/warden/backends/backendtest"
	"github.com/warden-go/warden/guard"
)

const endpointsEnv = "WARDEN_ETCD_ENDPOINTS"

// testPrefix keeps this package's keys apart from other users of the shared
// server.
const testPrefix = "warden-test/etcd"

// endpoints returns the shared test server's endpoints, or skips (fails with
// WARDEN_REQUIRE_SERVERS=1) when it is not running.
func endpoints(t testing.TB) []string {
	t.Helper()
	return strings.Split(backendtest.Addr(t, endpointsEnv, "127.0.0.1:12379"), ",")
}

// newClient returns a client of its own to eps, closed at cleanup.
func newClient(t testing.TB, eps []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newLocker returns a Locker on a client of its own, as a separate process
// would have.
func newLocker(t testing.TB, eps []string) (*Locker, *clientv3.Client) {
	t.Helper()
	c := newClient(t, eps)
	l, err := New(c, WithKeyPrefix(testPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l.Close(ctx)
	})
	return l, c
}

// keysUnder lists the contender keys of lock name.
func keysUnder(t testing.TB, c *clientv3.Client, l *Locker, name string) []string {
	t.Helper()
	resp, err := c.Get(context.Background(), l.dir(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("listing keys: %v", err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

func TestConformance(t *testing.T) {
	eps := endpoints(t)
	probe, probeClient := newLocker(t, eps)
	backendtest.Run(t, backendtest.Backend{
		NewLocker: func(t testing.TB) guard.Locker {
			l, _ := newLocker(t, eps)
			return l
		},
		TTL: MinTTL,
		Abandon: func(t testing.TB, l guard.Locker) {
			// As a crashed process: the keepalive stops, nothing is revoked.
			l.(*Locker).client.Close()
		},
		FIFO: true,
		Waiters: func(t testing.TB, key string) int {
			return max(len(keysUnder(t, probeClient, probe, key))-1, 0)
		},
	})
}

func TestInvalidTTL(t *testing.T) {
	eps := endpoints(t)
	l, _ := newLocker(t, eps)
	for _, ttl := range []time.Duration{time.Second, 500 * time.Millisecond, 2500 * time.Millisecond} {
		_, err := l.Acquire(context.Background(), "invalid-ttl", guard.AcquireOptions{TTL: ttl})
		if !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("Acquire with TTL %v: got %v, want ErrInvalidOption", ttl, err)
		}
	}
	lease, err := l.Acquire(context.Background(), "invalid-ttl", guard.AcquireOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	if err := lease.Refresh(context.Background(), 4*time.Second); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("Refresh with another TTL: got %v, want ErrInvalidOption", err)
	}
	if err := lease.Refresh(context.Background(), 3*time.Second); err != nil {
		t.Errorf("Refresh: %v", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("New(nil): got %v, want ErrInvalidOption", err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := New(c, WithKeyPrefix("/")); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("WithKeyPrefix(\"/\"): got %v, want ErrInvalidOption", err)
	}
	l, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AcquireSemaphore(context.Background(), "k", 0, guard.AcquireOptions{TTL: MinTTL}); !errors.Is(err, guard.ErrInvalidOption) {
		t.Errorf("0 permits: got %v, want ErrInvalidOption", err)
	}
}

func TestRefreshBatch(t *testing.T) {
	eps := endpoints(t)
	l, _ := newLocker(t, eps)
	other, _ := newLocker(t, eps)
	ctx := context.Background()
	opts := guard.AcquireOptions{TTL: MinTTL}
	name := fmt.Sprintf("refresh-batch/%d", time.Now().UnixNano())
	var leases []guard.Lease
	for i := range 3 {
		lease, err := l.Acquire(ctx, fmt.Sprintf("%s/%d", name, i), opts)
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		leases = append(leases, lease)
	}
	foreign, err := other.Acquire(ctx, name+"/foreign", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Release(ctx)
	if err := leases[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	errs := l.RefreshBatch(ctx, append(leases, foreign), MinTTL)
	for i, want := range []error{nil, guard.ErrNotHeld, nil, guard.ErrInvalidOption} {
		if (want == nil && errs[i] != nil) || !errors.Is(errs[i], want) {
			t.Errorf("lease %d: got %v, want %v", i, errs[i], want)
		}
	}
}

func TestCloseReleases(t *testing.T) {
	eps := endpoints(t)
	l, _ := newLocker(t, eps)
	other, _ := newLocker(t, eps)
	ctx := context.Background()
	name := fmt.Sprintf("close/%d", time.Now().UnixNano())
	lease, err := l.Acquire(ctx, name, guard.AcquireOptions{TTL: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-lease.Done():
	default:
		t.Error("Done is still open after Close")
	}
	// The lease was revoked: the lock is free at once, not after 60 s.
	next, err := other.Acquire(ctx, name, guard.AcquireOptions{TTL: MinTTL})
	if err != nil {
		t.Fatalf("Acquire after the holder closed: %v", err)
	}
	next.Release(ctx)
	if _, err := l.Acquire(ctx, name, guard.AcquireOptions{TTL: MinTTL}); !errors.Is(err, guard.ErrUnavailable) {
		t.Errorf("Acquire on a closed Locker: got %v, want ErrUnavailable", err)
	}
}

// TestNestedNames checks that a '/' in a name cannot put one lock's keys
// inside another's.
func TestNestedNames(t *testing.T) {
	eps := endpoints(t)
	l1, _ := newLocker(t, eps)
	l2, _ := newLocker(t, eps)
	ctx := context.Background()
	name := fmt.Sprintf("nested/%d", time.Now().UnixNano())
	opts := guard.AcquireOptions{TTL: MinTTL}
	inner, err := l1.Acquire(ctx, name+"/r/inner", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Release(ctx)
	outer, err := l2.Acquire(ctx, name, opts)
	if err != nil {
		t.Fatalf("lock %q is blocked by lock %q: %v", name, name+"/r/inner", err)
	}
	outer.Release(ctx)
	reader, err := l2.AcquireRead(ctx, name+"/r", opts)
	if err != nil {
		t.Fatalf("reader of %q is blocked by lock %q: %v", name+"/r", name+"/r/inner", err)
	}
	reader.Release(ctx)
}

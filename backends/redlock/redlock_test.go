package redlock

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/backendtest"
	"github.com/warden-go/warden/guard"
)

const addrsEnv = "WARDEN_REDLOCK_ADDRS"
const addrsDefault = "127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384"

// clients connects to addrs, as a separate process would.
func clients(t testing.TB, addrs []string, tweak func(*goredis.Options)) []goredis.UniversalClient {
	t.Helper()
	out := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		o := &goredis.Options{Addr: a, MaxRetries: -1, ContextTimeoutEnabled: true}
		if tweak != nil {
			tweak(o)
		}
		c := goredis.NewClient(o)
		t.Cleanup(func() { c.Close() })
		out[i] = c
	}
	return out
}

func sharedLocker(t testing.TB, opts ...Option) *Locker {
	t.Helper()
	v := backendtest.Addr(t, addrsEnv, addrsDefault)
	addrs := strings.Split(v, ",")
	for _, a := range addrs[1:] { // Addr checked only the first
		backendtest.Addr(t, addrsEnv, a)
	}
	l, err := New(clients(t, addrs, nil), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestConformance(t *testing.T) {
	// The node timeout must be far below the TTL, and long enough for a
	// loaded machine running the race detector to answer within it.
	backendtest.Run(t, backendtest.Backend{
		NewLocker: func(t testing.TB) guard.Locker { return sharedLocker(t, WithNodeTimeout(250*time.Millisecond)) },
		TTL:       time.Second,
	})
}

func TestNewRejectsEvenOrFewNodes(t *testing.T) {
	for _, n := range []int{0, 1, 2, 4} {
		if _, err := New(make([]goredis.UniversalClient, n)); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("New with %d nodes: got %v, want ErrInvalidOption", n, err)
		}
	}
}

func privateLocker(t *testing.T, servers []*server, tweak func(*goredis.Options), opts ...Option) *Locker {
	t.Helper()
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.addr
	}
	l, err := New(clients(t, addrs, tweak), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestMinorityDown: with 2 of 5 nodes killed a majority remains and the lock
// works, tokens still increasing; with 3 killed no majority is possible and
// Acquire reports the backend unavailable.
func TestMinorityDown(t *testing.T) {
	servers := startServers(t, 5)
	l := privateLocker(t, servers, nil, WithNodeTimeout(200*time.Millisecond))
	ctx := context.Background()
	opts := guard.AcquireOptions{TTL: 5 * time.Second}
	first, err := l.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatalf("all nodes up: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	servers[0].kill(t)
	servers[3].kill(t)
	lease, err := l.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatalf("2 of 5 nodes down: %v", err)
	}
	if lease.Token() <= first.Token() {
		t.Errorf("token %d after %d", lease.Token(), first.Token())
	}
	other, _ := New(l.nodes, WithNodeTimeout(200*time.Millisecond))
	if _, err := other.Acquire(ctx, "k", opts); !errors.Is(err, guard.ErrNotAcquired) {
		t.Errorf("second holder with 2 nodes down: got %v, want ErrNotAcquired", err)
	}
	if err := lease.Refresh(ctx, opts.TTL); err != nil {
		t.Errorf("Refresh with 2 of 5 nodes down: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release with 2 of 5 nodes down: %v", err)
	}
	servers[4].kill(t)
	if lease, err := l.Acquire(ctx, "k", opts); !errors.Is(err, guard.ErrUnavailable) {
		if err == nil {
			lease.Release(ctx)
		}
		t.Fatalf("3 of 5 nodes down: got %v, want ErrUnavailable", err)
	}
	if _, err := l.Acquire(ctx, "k", guard.AcquireOptions{TTL: opts.TTL, Wait: true}); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("waiting Acquire with 3 of 5 nodes down: got %v, want ErrUnavailable", err)
	}
}

// TestFrozenNode: a node stopped with SIGSTOP accepts connections but never
// answers. The clients here would wait 30s for it; the per-node timeout must
// cut that to about 200ms, in parallel with the other nodes.
func TestFrozenNode(t *testing.T) {
	servers := startServers(t, 5)
	const nodeTimeout = 200 * time.Millisecond
	l := privateLocker(t, servers, func(o *goredis.Options) {
		o.ReadTimeout = 30 * time.Second
		o.WriteTimeout = 30 * time.Second
		o.ContextTimeoutEnabled = false // the Locker must not rely on it
	}, WithNodeTimeout(nodeTimeout))
	ctx := context.Background()
	opts := guard.AcquireOptions{TTL: 10 * time.Second}
	warm, err := l.Acquire(ctx, "frozen", opts) // connections dialled, scripts cached
	if err != nil {
		t.Fatal(err)
	}
	warm.Release(ctx)

	servers[2].signal(t, syscall.SIGSTOP)
	defer servers[2].signal(t, syscall.SIGCONT)
	for i := range 3 {
		start := time.Now()
		lease, err := l.Acquire(ctx, "frozen", opts)
		took := time.Since(start)
		t.Logf("acquire %d with one node frozen: %v", i, took)
		if err != nil {
			t.Fatalf("acquire %d with a frozen node: %v", i, err)
		}
		// Generous for a busy machine, yet far below the client's 30s: the
		// acquisition waited on the frozen node at most about one timeout
		// per phase (vote, fence), not for its answer.
		if limit := 2*nodeTimeout + 3*time.Second; took > limit {
			t.Errorf("acquire %d took %v with one node frozen, want at most %v", i, took, limit)
		}
		if err := lease.Release(ctx); err != nil {
			t.Errorf("release %d: %v", i, err)
		}
	}
}

// TestTokensSurviveMinorityLoss: the fence counter is carried by majorities,
// so killing nodes that hold the highest counter does not lower tokens.
func TestTokensSurviveMinorityLoss(t *testing.T) {
	servers := startServers(t, 5)
	l := privateLocker(t, servers, nil, WithNodeTimeout(200*time.Millisecond))
	ctx := context.Background()
	opts := guard.AcquireOptions{TTL: 5 * time.Second}
	var last uint64
	for i, victim := range []int{-1, 1, 4} {
		if victim >= 0 {
			servers[victim].kill(t)
		}
		for range 3 {
			lease, err := l.Acquire(ctx, "fence", opts)
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			if lease.Token() <= last {
				t.Fatalf("round %d: token %d after %d", i, lease.Token(), last)
			}
			last = lease.Token()
			lease.Release(ctx)
		}
	}
}

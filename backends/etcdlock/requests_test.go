package etcdlock

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestNoPerLockRequests holds 10,000 locks through guard for two renewal
// periods of the session and counts what the client sends meanwhile: no
// unary request at all (guard refreshes no session lease), a keepalive or
// two per period on one stream, and no goroutine per held lock. Taking
// 10,000 locks under the race detector on a loaded machine can hold a put
// past the default request bound, or a 2 s session's keepalive past its
// TTL, and the session is then given up or declared lost, as it should be;
// neither is what this test is about, so its bound and TTL are generous.
func TestNoPerLockRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 10,000 locks")
	}
	drivertest.Exclusive(t, drivertest.HeavyTests)
	const locks = 10_000
	eps := endpoints(t)
	var rc requestCounter
	l := lockerOn(t, newClient(t, eps, rc.dialOptions()...), WithRequestTimeout(time.Minute))
	const ttl = 3 * MinTTL
	g, err := guard.New(l, guard.WithTTL(ttl), guard.WithPrefix(name("many")+"/"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	goroutines := runtime.NumGoroutine()

	held := make([]*guard.Lock, locks)
	var wg sync.WaitGroup
	errs := make(chan error, locks)
	const workers = 64
	for w := range workers {
		wg.Go(func() {
			for i := w; i < locks; i += workers {
				lk, err := g.TryLock(ctx, fmt.Sprint(i))
				if err != nil {
					errs <- err
					return
				}
				held[i] = lk
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, lk := range held {
			lk.Unlock(context.Background())
		}
	})
	if grew := runtime.NumGoroutine() - goroutines; grew > 50 {
		t.Errorf("%d goroutines more while holding %d locks", grew, locks)
	}

	l.mu.Lock()
	s := l.sessions[ttl]
	l.mu.Unlock()
	unary, sent := rc.unary.Load(), rc.sent.Load()
	start := time.Now()
	// Two renewal periods: two keepalives answered after this point.
	for range 2 {
		last := s.Expiry()
		waitFor(t, "a keepalive is answered", func() bool { return s.Expiry().After(last) })
	}
	// And one whole TTL, in case anything ran on a TTL-long timer.
	for time.Since(start) < ttl {
		time.Sleep(10 * time.Millisecond)
	}
	dUnary, dSent := rc.unary.Load()-unary, rc.sent.Load()-sent
	t.Logf("holding %d locks for %v: %d unary requests, %d messages sent", locks, time.Since(start).Round(time.Millisecond), dUnary, dSent)
	if dUnary != 0 {
		t.Errorf("%d unary requests while holding %d locks, want none", dUnary, locks)
	}
	// A keepalive every TTL/3, a new stream or so: nothing near one per lock.
	if periods := int64(time.Since(start)/(ttl/3)) + 1; dSent > 2*periods+2 {
		t.Errorf("%d messages sent in %d renewal periods", dSent, periods)
	}
	for i, lk := range held {
		if err := lk.Err(); err != nil {
			t.Fatalf("lock %d lost: %v", i, err)
		}
	}
}

// Ten thousand locks with a 3s ttl, kept by one session through one Guard
// while other processes load the machine: none is lost.
func TestHoldManyUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 10,000 locks for 6s")
	}
	l, _ := newLocker(t, endpoints(t))
	drivertest.HoldMany(t, l, 10_000, 3*time.Second, 6*time.Second)
}

// TestCycleRequests takes and releases an uncontended lock through
// guard.Do, on a context that can end (as a caller's usually can), and
// counts the unary requests the client sends: per cycle one transaction
// (the put, with the read of what stood before it) and one delete, the
// same two concurrency.Mutex sends for its Lock and Unlock, and nothing
// else. Probes (Status) are left out: a loaded machine that holds a request
// past probeAfter has its member probed, which is no part of the cycle; so
// is the session's one read of its revocation markers.
func TestCycleRequests(t *testing.T) {
	var (
		mu       sync.Mutex
		answered = map[string]int{}
		failed   = map[string]int{}
	)
	count := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		mu.Lock()
		defer mu.Unlock()
		// Probes, and the session's revocation watch reading its markers
		// once it is set up (in the background, perhaps during the
		// cycles), are no part of a cycle.
		rr, watch := req.(*etcdserverpb.RangeRequest)
		watch = watch && strings.HasPrefix(string(rr.Key), RevokedPrefix)
		if err != nil {
			failed[method]++
		} else if method != "/etcdserverpb.Maintenance/Status" && !watch {
			answered[method]++
		}
		return err
	})
	l := lockerOn(t, newClient(t, endpoints(t), count))
	g, err := guard.New(l, guard.WithTTL(10*time.Second), guard.WithPrefix(name("cycle")+"/"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cycle := func() {
		t.Helper()
		if err := g.Do(ctx, "k", func(context.Context, *guard.Lock) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // starts the session: a grant, not part of a cycle
	mu.Lock()
	clear(answered)
	clear(failed)
	mu.Unlock()

	const cycles = 20
	for range cycles {
		cycle()
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"/etcdserverpb.KV/Txn": cycles, "/etcdserverpb.KV/DeleteRange": cycles}
	if !maps.Equal(answered, want) {
		t.Errorf("%d cycles sent %v (and %v unanswered), want %v", cycles, answered, failed, want)
	}
}

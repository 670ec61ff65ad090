package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// serverSlack is what a call against a real server may take past its bound
// here: guard's grace, and room for a machine shared with other test runs.
// The figures are logged; on a quiet machine they are the grace.
const serverSlack = 300 * time.Millisecond

// hungAddr is the address of a proxy to upstream that accepts connections
// and never answers on them: a server that hangs.
func hungAddr(t *testing.T, upstream string) string {
	t.Helper()
	p := drivertest.StartProxy(t, upstream)
	p.Blackhole()
	return p.Addr()
}

// boundCase is one call with its bound, and the errors it may end with.
type boundCase struct {
	name  string
	bound time.Duration
	call  func(g *guard.Guard) error
}

func boundCases(callTimeout, ctxBound time.Duration) []boundCase {
	return []boundCase{
		{"WaitAtMost(1s)", time.Second, func(g *guard.Guard) error {
			_, err := g.Lock(context.Background(), "k", guard.WaitAtMost(time.Second))
			return err
		}},
		{"NoWait", callTimeout, func(g *guard.Guard) error {
			_, err := g.Lock(context.Background(), "k", guard.NoWait())
			return err
		}},
		{fmt.Sprintf("Lock ctx %v", ctxBound), ctxBound, func(g *guard.Guard) error {
			ctx, cancel := context.WithTimeout(context.Background(), ctxBound)
			defer cancel()
			_, err := g.Lock(ctx, "k")
			return err
		}},
		{fmt.Sprintf("TryLock ctx %v", ctxBound), ctxBound, func(g *guard.Guard) error {
			ctx, cancel := context.WithTimeout(context.Background(), ctxBound)
			defer cancel()
			_, err := g.TryLock(ctx, "k")
			return err
		}},
		{"Ping ctx 1s", time.Second, func(g *guard.Guard) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			return g.Ping(ctx)
		}},
		{"Inspect ctx 1s", time.Second, func(g *guard.Guard) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := g.Inspect(ctx, "k")
			return err
		}},
	}
}

// checkBounds runs every case at once on a Guard over newLocker, and checks
// that each returned within its bound and serverSlack, reporting the
// backend unavailable (for a call ended by ctx's deadline: that deadline's
// error, matching ErrUnavailable as well). NoWait's bound is callTimeout,
// the Guard's.
func checkBounds(t *testing.T, newLocker func(t *testing.T) driver.Locker, callTimeout, ctxBound time.Duration) {
	g := newGuard(t, newLocker(t), guard.WithCallTimeout(callTimeout),
		guard.WithPrefix(fmt.Sprintf("bounds-%d:", time.Now().UnixNano())))
	var wg sync.WaitGroup
	for _, c := range boundCases(callTimeout, ctxBound) {
		wg.Go(func() {
			start := time.Now()
			err := c.call(g)
			took := time.Since(start)
			t.Logf("%s: %v, %v", c.name, took.Round(time.Millisecond), err)
			if !errors.Is(err, guard.ErrUnavailable) {
				t.Errorf("%s: %v, want an error matching ErrUnavailable", c.name, err)
			}
			if errors.Is(err, guard.ErrNotAcquired) {
				t.Errorf("%s: an outage reported as contention: %v", c.name, err)
			}
			if took > c.bound+serverSlack {
				t.Errorf("%s took %v, bound %v", c.name, took, c.bound)
			}
		})
	}
	wg.Wait()
}

// redisLocker is a redislock.Locker over a client made with opts, closed
// with t.
func redisLocker(t *testing.T, opts *goredis.Options) *redislock.Locker {
	t.Helper()
	c := goredis.NewClient(opts)
	l, err := redislock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); c.Close() })
	return l
}

// Finding 1 of issue 21: with go-redis's default options (the README's
// setup), a closed port took 2.7s for WaitAtMost(1s) and said ErrNotAcquired;
// a hanging server took 10s for every call.
func TestBoundsWithADefaultRedisClient(t *testing.T) {
	addr := drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	redis := func(server string) func(t *testing.T) driver.Locker {
		return func(t *testing.T) driver.Locker { return redisLocker(t, &goredis.Options{Addr: server}) }
	}
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		checkBounds(t, redis(drivertest.ClosedAddr(t)), time.Second, time.Second)
	})
	t.Run("hanging", func(t *testing.T) {
		t.Parallel()
		checkBounds(t, redis(hungAddr(t, addr)), time.Second, time.Second)
	})
}

// With ContextTimeoutEnabled, go-redis ends a call at its context's
// deadline but not at its cancellation; redislock declares
// driver.DeadlineBounded then, and guard makes the release, and the
// acquisitions under a context with no cancellation, on the caller's
// goroutine. Every bound still holds against a hung server, a release's
// too.
func TestBoundsWithADeadlineRedisClient(t *testing.T) {
	addr := drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	redis := func(server string) func(t *testing.T) driver.Locker {
		return func(t *testing.T) driver.Locker {
			l := redisLocker(t, &goredis.Options{Addr: server, ContextTimeoutEnabled: true})
			if !l.BoundedByDeadline() {
				t.Fatal("redislock over a client with ContextTimeoutEnabled is not DeadlineBounded")
			}
			return l
		}
	}
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		checkBounds(t, redis(drivertest.ClosedAddr(t)), time.Second, time.Second)
	})
	t.Run("hanging", func(t *testing.T) {
		t.Parallel()
		checkBounds(t, redis(hungAddr(t, addr)), time.Second, time.Second)
	})
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		p := drivertest.StartProxy(t, addr)
		g := newGuard(t, redis(p.Addr())(t), guard.WithReleaseTimeout(time.Second),
			guard.WithPrefix(fmt.Sprintf("bounds-%d:", time.Now().UnixNano())))
		l, err := g.Lock(context.Background(), "k", guard.NoWait())
		if err != nil {
			t.Fatal(err)
		}
		p.Blackhole()
		start := time.Now()
		err = l.Unlock(context.Background())
		took := time.Since(start)
		t.Logf("Unlock, hung: %v, %v", took.Round(time.Millisecond), err)
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Unlock, hung: %v, want an error matching ErrUnavailable", err)
		}
		if took > time.Second+serverSlack {
			t.Errorf("Unlock, hung, took %v, release timeout 1s", took)
		}
	})
}

// Finding 2 of issue 21: etcd's contender put is detached from the caller's
// ctx (so that a put applied late leaves no key behind) and ran to the 5s
// request timeout, past a 3s deadline. guard keeps the deadline, and what
// the put leaves is released in the background.
func TestBoundsWithADefaultEtcdClient(t *testing.T) {
	addr := drivertest.Addr(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379")
	etcd := func(server string) func(t *testing.T) driver.Locker {
		return func(t *testing.T) driver.Locker {
			c, err := clientv3.New(clientv3.Config{Endpoints: []string{server}, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			l, err := etcdlock.New(c)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// Bounded: Close revokes the sessions, one request timeout
				// each, on a server that does not answer.
				done := make(chan struct{})
				go func() { l.Close(); c.Close(); close(done) }()
				select {
				case <-done:
				case <-time.After(15 * time.Second):
				}
			})
			return l
		}
	}
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		checkBounds(t, etcd(drivertest.ClosedAddr(t)), 4*time.Second, 3*time.Second)
	})
	t.Run("hanging", func(t *testing.T) {
		t.Parallel()
		checkBounds(t, etcd(hungAddr(t, addr)), 4*time.Second, 3*time.Second)
	})
}

// Finding 2 of issue 21, as a leader election leaves it: the Locker's
// session was made while etcd answered, then etcd stops answering. The
// contender's put, detached from the caller's ctx, ran to the 5s request
// timeout; the TryLock with a 3s deadline must return at 3s all the same,
// and the put left behind must leave no key once etcd answers again.
func TestEtcdTryLockKeepsItsDeadlineWithALiveSession(t *testing.T) {
	addr := drivertest.Addr(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379")
	p := drivertest.StartProxy(t, addr)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr()}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	l, err := etcdlock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g := newGuard(t, l, guard.WithTTL(5*time.Second), guard.WithPrefix(fmt.Sprintf("bounds-%d:", time.Now().UnixNano())))
	// The session is made, and a lock taken and given back, while etcd
	// answers.
	first, err := g.TryLock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err = g.TryLock(ctx, "k")
	took := time.Since(start)
	t.Logf("TryLock with a 3s deadline, etcd silent: %v, %v", took.Round(time.Millisecond), err)
	if took > 3*time.Second+serverSlack {
		t.Errorf("TryLock with a 3s deadline took %v", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, guard.ErrUnavailable) {
		t.Errorf("TryLock with a 3s deadline, etcd silent: %v, want the deadline or ErrUnavailable", err)
	}
	// etcd answers again: whatever the late put did is undone, and the
	// lock is free for the next caller.
	p.Reset()
	got, err := g.Lock(context.Background(), "k", guard.WaitAtMost(20*time.Second))
	if err != nil {
		t.Fatalf("the lock after etcd answered again: %v", err)
	}
	got.Unlock(context.Background())
}

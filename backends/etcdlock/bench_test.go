package etcdlock

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// contender is one party to a handoff benchmark: warden's Locker or, as the
// peer to compare with, client/v3/concurrency.Mutex.
type contender interface {
	lock(ctx context.Context) error
	unlock(ctx context.Context) error
}

type wardenContender struct {
	l     *Locker
	key   string
	lease driver.Lease
}

func (c *wardenContender) lock(ctx context.Context) (err error) {
	c.lease, err = c.l.Acquire(ctx, c.key, opts(MinTTL, true))
	return err
}

func (c *wardenContender) unlock(ctx context.Context) error { return c.lease.Release(ctx) }

// guardContender runs guard.Do with an empty section: lock and unlock in
// one call.
type guardContender struct {
	g   *guard.Guard
	key string
}

func (c *guardContender) lock(ctx context.Context) error {
	return c.g.Do(ctx, c.key, func(context.Context, *guard.Lock) error { return nil })
}

func (c *guardContender) unlock(context.Context) error { return nil }

type mutexContender struct{ m *concurrency.Mutex }

func (c *mutexContender) lock(ctx context.Context) error   { return c.m.Lock(ctx) }
func (c *mutexContender) unlock(ctx context.Context) error { return c.m.Unlock(ctx) }

// BenchmarkHandoff has 8 contenders, each with its own client and session,
// take one lock in turn, and reports the handoff latency (from the holder's
// release call to the next holder's acquisition returning) and handoffs per
// second, for warden and for concurrency.Mutex on the same server.
func BenchmarkHandoff(b *testing.B) {
	const contenders = 8
	eps := endpoints(b)
	b.Run("warden", func(b *testing.B) {
		key := name("bench/handoff")
		cs := make([]contender, contenders)
		for i := range cs {
			l, _ := newLocker(b, eps)
			cs[i] = &wardenContender{l: l, key: key}
		}
		runHandoffs(b, cs)
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		pfx := name("bench-mutex")
		cs := make([]contender, contenders)
		for i := range cs {
			s, err := concurrency.NewSession(newClient(b, eps), concurrency.WithTTL(int(MinTTL/time.Second)))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			cs[i] = &mutexContender{concurrency.NewMutex(s, pfx)}
		}
		runHandoffs(b, cs)
	})
}

func runHandoffs(b *testing.B, cs []contender) {
	ctx := context.Background()
	var (
		count    atomic.Int64
		released atomic.Int64 // when the last release started, in ns since start; 0 before the first
		mu       sync.Mutex
		handoffs []time.Duration
		wg       sync.WaitGroup
	)
	start := time.Now()
	b.ResetTimer()
	for _, c := range cs {
		wg.Go(func() {
			for {
				if err := c.lock(ctx); err != nil {
					b.Error(err)
					return
				}
				now := time.Since(start)
				if r := released.Load(); r > 0 {
					mu.Lock()
					handoffs = append(handoffs, now-time.Duration(r))
					mu.Unlock()
				}
				n := count.Add(1)
				released.Store(int64(time.Since(start)))
				if err := c.unlock(ctx); err != nil {
					b.Error(err)
					return
				}
				if n >= int64(b.N) {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if len(handoffs) == 0 {
		return
	}
	slices.Sort(handoffs)
	pct := func(p float64) float64 {
		return float64(handoffs[int(p*float64(len(handoffs)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(count.Load())/elapsed.Seconds(), "handoffs/s")
}

// requestCounter counts the messages a client sends (unary requests, and
// stream messages: watch creations and cancellations, keepalives) and
// receives on streams (watch notifications and acknowledgements).
type requestCounter struct{ unary, sent, received atomic.Int64 }

func (rc *requestCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			rc.unary.Add(1)
			rc.sent.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return &countedStream{ClientStream: s, rc: rc}, nil
		}),
	}
}

type countedStream struct {
	grpc.ClientStream
	rc *requestCounter
}

func (s *countedStream) SendMsg(m any) error {
	s.rc.sent.Add(1)
	return s.ClientStream.SendMsg(m)
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.rc.received.Add(1)
	}
	return err
}

// BenchmarkRequestsPerHandoff queues 4, 16 and 64 waiters behind a holder and
// counts what all clients send to and receive from etcd while the lock goes
// down the queue. Flat figures across queue lengths mean a release wakes one
// waiter, not the herd.
func BenchmarkRequestsPerHandoff(b *testing.B) {
	eps := endpoints(b)
	const clients = 4
	var rc requestCounter
	lockers := make([]*Locker, clients)
	var probe *clientv3.Client
	for i := range lockers {
		c := newClient(b, eps, rc.dialOptions()...)
		lockers[i] = lockerOn(b, c)
		probe = c
	}
	o := opts(MinTTL, true)
	for _, waiters := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("waiters=%d", waiters), func(b *testing.B) {
			ctx := context.Background()
			var unary, sent, received, handoffs int64
			for b.Loop() {
				key := name("bench/requests")
				holder, err := lockers[0].Acquire(ctx, key, o)
				if err != nil {
					b.Fatal(err)
				}
				var wg sync.WaitGroup
				for i := range waiters {
					l := lockers[i%clients]
					wg.Go(func() {
						lease, err := l.Acquire(ctx, key, o)
						if err != nil {
							b.Error(err)
							return
						}
						if err := lease.Release(ctx); err != nil {
							b.Error(err)
						}
					})
				}
				// Everyone queued (and their watches created) before counting.
				for len(keysUnder(b, probe, key)) < waiters+1 {
					time.Sleep(time.Millisecond)
				}
				time.Sleep(50 * time.Millisecond)
				u0, s0, r0 := rc.unary.Load(), rc.sent.Load(), rc.received.Load()
				if err := holder.Release(ctx); err != nil {
					b.Fatal(err)
				}
				wg.Wait()
				unary += rc.unary.Load() - u0
				sent += rc.sent.Load() - s0
				received += rc.received.Load() - r0
				handoffs += int64(waiters)
			}
			b.ReportMetric(float64(unary)/float64(handoffs), "requests/handoff")
			b.ReportMetric(float64(sent)/float64(handoffs), "sent/handoff")
			b.ReportMetric(float64(received)/float64(handoffs), "recv/handoff")
		})
	}
}

// BenchmarkCycle times one uncontended Acquire and Release, the same
// through guard.Do (as bench-peers and users run it), and, in the same run,
// concurrency.Mutex's Lock and Unlock on a session of its own (the same two
// transactions), so that they compare as ratios and as allocations per
// cycle. Every cycle gets a context that can end, as a caller's usually
// can (and bench-peers' does): the put then runs on a runner (see
// unbound), which a context that cannot end skips.
func BenchmarkCycle(b *testing.B) {
	eps := endpoints(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.Run("warden", func(b *testing.B) {
		l, _ := newLocker(b, eps)
		c := &wardenContender{l: l, key: name("bench/cycle")}
		cycles(b, ctx, c)
	})
	b.Run("guard.Do", func(b *testing.B) {
		l, _ := newLocker(b, eps)
		g, err := guard.New(l, guard.WithTTL(MinTTL), guard.WithPrefix(name("bench-guard")+"/"))
		if err != nil {
			b.Fatal(err)
		}
		cycles(b, ctx, &guardContender{g: g, key: "cycle"})
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		s, err := concurrency.NewSession(newClient(b, eps), concurrency.WithTTL(int(MinTTL/time.Second)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		cycles(b, ctx, &mutexContender{concurrency.NewMutex(s, name("bench-cycle"))})
	})
}

func cycles(b *testing.B, ctx context.Context, c contender) {
	// The first lock starts the session.
	if err := c.lock(ctx); err != nil {
		b.Fatal(err)
	}
	if err := c.unlock(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := c.unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeldLocks holds 10,000 locks of one Guard, as many bare leases
// of one Locker, and as many concurrency.Mutexes of one Session, and
// reports the live heap each held lock takes: B/lock through guard,
// backend-B/lock for the bare leases (etcdlock's own share), and
// mutex-B/lock for the peer, whose 1.5x is issue 24's target for B/lock.
// The TTL (10s) does not change the heap; a shorter one loses sessions on
// a loaded machine while 10,000 keys are put.
func BenchmarkHeldLocks(b *testing.B) {
	const n = 10_000
	eps := endpoints(b)
	ctx := context.Background()
	// hold takes n locks, 16 at a time, and returns the heap they added
	// per lock.
	hold := func(take func(i int) error) float64 {
		before := drivertest.HeapAlloc()
		var (
			wg   sync.WaitGroup
			next atomic.Int64
		)
		for range 16 {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
					if err := take(i); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
		return float64(int64(drivertest.HeapAlloc())-int64(before)) / n
	}
	const ttl = 10 * time.Second
	var perLock, backend, mutex float64
	for b.Loop() {
		pfx := name("bench-held")
		l, _ := newLocker(b, eps)
		if lease, err := l.Acquire(ctx, pfx+"/warm", opts(ttl, false)); err != nil {
			b.Fatal(err)
		} else if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		leases := make([]driver.Lease, n)
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("%s/bare/%d", pfx, i)
		}

		// The peer first: what guard's keeper lets go of only at its
		// next round must not shrink the heap under the peer's locks.
		s, err := concurrency.NewSession(newClient(b, eps), concurrency.WithTTL(int(ttl/time.Second)))
		if err != nil {
			b.Fatal(err)
		}
		mutexes := make([]*concurrency.Mutex, n)
		mutex = hold(func(i int) error {
			mutexes[i] = concurrency.NewMutex(s, names[i]+"/mutex")
			return mutexes[i].Lock(ctx)
		})
		runtime.KeepAlive(mutexes)
		s.Close()

		backend = hold(func(i int) (err error) {
			leases[i], err = l.Acquire(ctx, names[i], opts(ttl, false))
			return err
		})
		for _, le := range leases {
			if err := le.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}

		g, err := guard.New(l, guard.WithTTL(ttl), guard.WithPrefix(pfx+"/guard/"))
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("held/%d", i)
		}
		locks := make([]*guard.Lock, n)
		perLock = hold(func(i int) (err error) {
			locks[i], err = g.TryLock(ctx, keys[i])
			return err
		})
		for _, lk := range locks {
			if err := lk.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}

	}
	b.ReportMetric(perLock, "B/lock")
	b.ReportMetric(backend, "backend-B/lock")
	b.ReportMetric(mutex, "mutex-B/lock")
}

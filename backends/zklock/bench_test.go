package zklock

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// cycler takes a lock and returns what releases it.
type cycler func(ctx context.Context) (release func(ctx context.Context) error, err error)

// wardenContender acquires key on l, waiting.
func wardenContender(l *Locker, key string) cycler {
	return func(ctx context.Context) (func(context.Context) error, error) {
		lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession, Wait: true})
		if err != nil {
			return nil, err
		}
		return lease.Release, nil
	}
}

// guardContender locks key through a Guard on l, as an application
// would.
func guardContender(b testing.TB, l *Locker, key string) cycler {
	g, err := guard.New(l, guard.WithTTL(testSession), guard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	return func(ctx context.Context) (func(context.Context) error, error) {
		lock, err := g.Lock(ctx, key)
		if err != nil {
			return nil, err
		}
		return lock.Unlock, nil
	}
}

// zkLockContender is go-zookeeper's Lock recipe on conn, on the same
// parent node as warden's lock on key.
func zkLockContender(conn *zk.Conn, key string) cycler {
	lock := zk.NewLock(conn, testRoot+"/"+escape(key)+"~zk.Lock", zk.WorldACL(zk.PermAll))
	return func(context.Context) (func(context.Context) error, error) {
		if err := lock.Lock(); err != nil {
			return nil, err
		}
		return func(context.Context) error { return lock.Unlock() }, nil
	}
}

// contend runs the contenders, each acquiring and releasing its lock in a
// loop, until handoffs acquisitions have happened. It returns the handoff
// latencies: from a holder's release to the next holder's grant.
func contend(b *testing.B, cs []cycler, handoffs int) []time.Duration {
	b.Helper()
	// Cancellable, without a deadline, as a worker's in bench-peers.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		count     atomic.Int64
		released  atomic.Int64 // UnixNano of the latest release, 0 before the first
		mu        sync.Mutex
		latencies = make([]time.Duration, 0, handoffs)
		wg        sync.WaitGroup
		errOnce   sync.Once
		firstErr  error
	)
	for _, c := range cs {
		wg.Go(func() {
			for count.Load() < int64(handoffs) {
				release, err := c(ctx)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					return
				}
				if at := released.Load(); at != 0 {
					mu.Lock()
					latencies = append(latencies, time.Since(time.Unix(0, at)))
					mu.Unlock()
				}
				count.Add(1)
				released.Store(time.Now().UnixNano())
				if err := release(ctx); err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return latencies
}

// BenchmarkHandoff measures how long a lock takes to pass from one holder to
// the next among 8 and 64 contenders on separate sessions, each releasing as
// soon as it holds, for the Locker, for a Guard on it (as bench-peers
// measures warden) and, in the same run, for go-zookeeper's Lock.
// goroutines/op counts the goroutines the process starts per handoff, and
// requests/op the requests the contenders send (warden's Lockers count
// theirs; zk.Lock's are the frames its connections write).
func BenchmarkHandoff(b *testing.B) {
	srv := servers(b)
	run := func(b *testing.B, cs []cycler, requests func() int64) {
		b.ReportAllocs()
		started, sent, use := goroutinesStarted(), requests(), usage(b)
		b.ResetTimer()
		lat := contend(b, cs, b.N+1)
		b.StopTimer()
		used := usage(b)
		b.ReportMetric(float64(used.cpu-use.cpu)/1e3/float64(b.N), "cpu-µs/op")
		b.ReportMetric(float64(used.switches-use.switches)/float64(b.N), "switches/op")
		b.ReportMetric(float64(goroutinesStarted()-started)/float64(b.N), "goroutines/op")
		b.ReportMetric(float64(requests()-sent)/float64(b.N), "requests/op")
		if len(lat) == 0 {
			return
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("contenders=%d/zklock", n), func(b *testing.B) {
			key := testKey(b)
			ls, requests := lockers(b, srv, n)
			cs := make([]cycler, n)
			for i, l := range ls {
				cs[i] = wardenContender(l, key)
			}
			run(b, cs, requests)
		})
		b.Run(fmt.Sprintf("contenders=%d/guard", n), func(b *testing.B) {
			key := testKey(b)
			ls, requests := lockers(b, srv, n)
			cs := make([]cycler, n)
			for i, l := range ls {
				cs[i] = guardContender(b, l, key)
			}
			run(b, cs, requests)
		})
		b.Run(fmt.Sprintf("contenders=%d/zk.Lock", n), func(b *testing.B) {
			cs, fc := zkLockContenders(b, srv, testKey(b), n)
			run(b, cs, fc.requests.Load)
		})
	}
}

// BenchmarkRequestsPerHandoff counts the requests all contenders send per
// handoff with 4, 16 and 64 waiters queued, each contender releasing as soon
// as it holds and queuing again: a figure that stays flat as the queue
// grows shows a release wakes one waiter, not the herd. Heartbeats are not
// counted. go-zookeeper's Lock, in the same run, is counted by the frames
// its connections write (pings and the connect handshake left out), and so
// are the watch notifications each side's connections receive.
func BenchmarkRequestsPerHandoff(b *testing.B) {
	srv := servers(b)
	for _, n := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("waiters=%d/zklock", n), func(b *testing.B) {
			key := testKey(b)
			ls, sum := lockers(b, srv, n+1) // one holder and n waiters
			cs := make([]cycler, len(ls))
			for i, l := range ls {
				cs[i] = wardenContender(l, key)
			}
			before, started := sum(), goroutinesStarted()
			b.ResetTimer()
			contend(b, cs, b.N)
			b.StopTimer()
			b.ReportMetric(float64(sum()-before)/float64(b.N), "requests/handoff")
			b.ReportMetric(float64(goroutinesStarted()-started)/float64(b.N), "goroutines/handoff")
		})
		b.Run(fmt.Sprintf("waiters=%d/zk.Lock", n), func(b *testing.B) {
			cs, fc := zkLockContenders(b, srv, testKey(b), n+1)
			before, started := fc.requests.Load(), goroutinesStarted()
			b.ResetTimer()
			contend(b, cs, b.N)
			b.StopTimer()
			b.ReportMetric(float64(fc.requests.Load()-before)/float64(b.N), "requests/handoff")
			b.ReportMetric(float64(goroutinesStarted()-started)/float64(b.N), "goroutines/handoff")
		})
	}
}

// lockers dials n Lockers, and returns them with the sum of the requests
// they have sent.
func lockers(b *testing.B, srv []string, n int) ([]*Locker, func() int64) {
	ls := make([]*Locker, n)
	for i := range ls {
		ls[i] = dial(b, srv)
	}
	return ls, func() (s int64) {
		for _, l := range ls {
			s += l.requests.Load()
		}
		return s
	}
}

// zkLockContenders are n of go-zookeeper's Lock on key, each on a session
// of its own, with the counter of the requests they write.
func zkLockContenders(b *testing.B, srv []string, key string, n int) ([]cycler, *frameCounter) {
	fc := new(frameCounter)
	cs := make([]cycler, n)
	for i := range cs {
		conn, _, err := zk.Connect(srv, testSession, zk.WithLogger(discard{}), zk.WithDialer(fc.dial))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(conn.Close)
		cs[i] = zkLockContender(conn, key)
	}
	return cs, fc
}

// use is what the process has used: CPU time (user and system), and the
// context switches its threads made, each a sleep and a wake-up.
type use struct {
	cpu      time.Duration
	switches int64
}

func usage(b *testing.B) use {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return use{
		cpu:      time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		switches: ru.Nvcsw + ru.Nivcsw,
	}
}

// goroutinesStarted is the number of goroutines the process has started.
func goroutinesStarted() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// frameCounter counts the requests that go-zookeeper connections dialed
// through it write: every frame but the connect handshake and pings.
type frameCounter struct{ requests atomic.Int64 }

func (fc *frameCounter) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, fc: fc}, nil
}

// countedConn parses the frames written to it: a 4-byte length, then, after
// the handshake, a 4-byte xid and a 4-byte opcode.
type countedConn struct {
	net.Conn
	fc        *frameCounter
	buf       []byte
	handshake bool
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.buf = append(c.buf, p...)
	for len(c.buf) >= 4 {
		n := int(binary.BigEndian.Uint32(c.buf))
		if len(c.buf) < 4+n {
			break
		}
		frame := c.buf[4 : 4+n]
		c.buf = c.buf[4+n:]
		if !c.handshake {
			c.handshake = true
			continue
		}
		const opPing = 11
		if len(frame) >= 8 && int32(binary.BigEndian.Uint32(frame[4:8])) != opPing {
			c.fc.requests.Add(1)
		}
	}
	return c.Conn.Write(p)
}

// BenchmarkCycle times one uncontended Acquire and Release, and, in the same
// run, go-zookeeper's zk.Lock on a session of its own (its Lock and Unlock:
// a create, a listing and a delete), so that the two can be compared as a
// ratio. requests/op counts the Locker's requests, and zk.Lock's by the
// frames its connection writes.
func BenchmarkCycle(b *testing.B) {
	srv := servers(b)
	ctx := context.Background()
	b.Run("zklock", func(b *testing.B) {
		l := dial(b, srv)
		key := testKey(b)
		b.ReportAllocs()
		before, started := l.requests.Load(), goroutinesStarted()
		for b.Loop() {
			lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession})
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(l.requests.Load()-before)/float64(b.N), "requests/op")
		b.ReportMetric(float64(goroutinesStarted()-started)/float64(b.N), "goroutines/op")
	})
	b.Run("zk.Lock", func(b *testing.B) {
		var fc frameCounter
		conn, _, err := zk.Connect(srv, testSession, zk.WithLogger(discard{}), zk.WithDialer(fc.dial))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		lock := zk.NewLock(conn, testRoot+"/"+escape(testKey(b)), zk.WorldACL(zk.PermAll))
		b.ReportAllocs()
		before, started := fc.requests.Load(), goroutinesStarted()
		for b.Loop() {
			if err := lock.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := lock.Unlock(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(fc.requests.Load()-before)/float64(b.N), "requests/op")
		b.ReportMetric(float64(goroutinesStarted()-started)/float64(b.N), "goroutines/op")
	})
}

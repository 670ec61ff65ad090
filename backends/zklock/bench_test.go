package zklock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// contend runs one contender per locker, each acquiring and releasing key in
// a loop, until handoffs acquisitions have happened. It returns the handoff
// latencies: from a holder's release to the next holder's grant.
func contend(b *testing.B, lockers []*Locker, key string, handoffs int) []time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
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
	for _, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for count.Load() < int64(handoffs) {
				lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession, Wait: true})
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
				if err := lease.Release(ctx); err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return latencies
}

// BenchmarkHandoff measures how long a lock takes to pass from one holder to
// the next among 8 contenders on separate sessions.
func BenchmarkHandoff(b *testing.B) {
	srv := servers(b)
	lockers := make([]*Locker, 8)
	for i := range lockers {
		lockers[i] = dial(b, srv)
	}
	key := testKey(b)
	b.ResetTimer()
	lat := contend(b, lockers, key, b.N+1)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRequestsPerHandoff counts the requests all contenders send per
// handoff with 4, 16 and 64 waiters queued: a figure that stays flat as the
// queue grows shows a release wakes one waiter, not the herd. Heartbeats are
// not counted.
func BenchmarkRequestsPerHandoff(b *testing.B) {
	srv := servers(b)
	for _, n := range []int{4, 16, 64} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			lockers := make([]*Locker, n+1) // one holder and n waiters
			for i := range lockers {
				lockers[i] = dial(b, srv)
			}
			key := testKey(b)
			sum := func() (s int64) {
				for _, l := range lockers {
					s += l.requests.Load()
				}
				return s
			}
			before := sum()
			b.ResetTimer()
			contend(b, lockers, key, b.N)
			b.StopTimer()
			b.ReportMetric(float64(sum()-before)/float64(b.N), "requests/handoff")
		})
	}
}

// BenchmarkCycle times one uncontended Acquire and Release, and, in the same
// run, go-zookeeper's zk.Lock on a session of its own (its Lock and Unlock:
// a create, a listing and a delete), so that the two can be compared as a
// ratio. requests/op counts the Locker's requests.
func BenchmarkCycle(b *testing.B) {
	srv := servers(b)
	ctx := context.Background()
	b.Run("zklock", func(b *testing.B) {
		l := dial(b, srv)
		key := testKey(b)
		b.ReportAllocs()
		before := l.requests.Load()
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
	})
	b.Run("zk.Lock", func(b *testing.B) {
		conn, _, err := zk.Connect(srv, testSession, zk.WithLogger(discard{}))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		lock := zk.NewLock(conn, testRoot+"/"+escape(testKey(b)), zk.WorldACL(zk.PermAll))
		b.ReportAllocs()
		for b.Loop() {
			if err := lock.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := lock.Unlock(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

package redislock

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// counter is a go-redis hook that counts round trips (a command or a
// pipeline) and commands sent.
type counter struct{ trips, cmds atomic.Int64 }

func (c *counter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *counter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.trips.Add(1)
		c.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		c.trips.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func (c *counter) reset() { c.trips.Store(0); c.cmds.Store(0) }

func countedClient(b *testing.B) (*goredis.Client, *counter) {
	c := newClient(b)
	n := &counter{}
	c.AddHook(n)
	return c, n
}

func benchKey(b *testing.B) string {
	return fmt.Sprintf("bench/%s/%d", b.Name(), time.Now().UnixNano())
}

// BenchmarkAcquireRelease: an uncontended acquisition and release; the
// trips/op metric is round trips to Redis (target 2).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, fair := range []bool{false, true} {
		b.Run(fmt.Sprintf("fair=%v", fair), func(b *testing.B) {
			c, n := countedClient(b)
			l := newLocker(b, c)
			ctx := context.Background()
			key := benchKey(b)
			opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Fair: fair}
			once := func() {
				lease, err := l.Acquire(ctx, key, opts)
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
			once() // scripts cached on the server
			n.reset()
			b.ResetTimer()
			for range b.N {
				once()
			}
			b.ReportMetric(float64(n.trips.Load())/float64(b.N), "trips/op")
		})
	}
}

// BenchmarkContended: contenders goroutines of one process (one Locker)
// take turns on one key, each acquisition waiting. cmds/op is Redis
// commands per acquisition, including failed attempts: with notification
// rather than polling it stays near the uncontended 2.
func BenchmarkContended(b *testing.B) {
	for _, contenders := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("waiters=%d", contenders), func(b *testing.B) {
			c, n := countedClient(b)
			l := newLocker(b, c)
			key := benchKey(b)
			contend(b, contenders, func(int) driver.Locker { return l }, key, false)
			b.ReportMetric(float64(n.cmds.Load())/float64(b.N), "cmds/op")
		})
	}
}

// BenchmarkWait: 8 contenders, each its own client as separate processes
// would be, take turns on one key; reports the wait of an acquisition at the
// median and the 99th percentile, fair and not.
func BenchmarkWait(b *testing.B) {
	for _, fair := range []bool{false, true} {
		b.Run(fmt.Sprintf("fair=%v", fair), func(b *testing.B) {
			lockers := make([]driver.Locker, 8)
			for i := range lockers {
				lockers[i] = newLocker(b, newClient(b))
			}
			waits := contend(b, len(lockers), func(i int) driver.Locker { return lockers[i] }, benchKey(b), fair)
			slices.Sort(waits)
			if len(waits) > 0 {
				p50, p99 := waits[len(waits)/2], waits[len(waits)*99/100]
				b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			}
		})
	}
}

// contend runs b.N acquisitions shared among contenders goroutines, holding
// each lock for 100µs, and returns how long each acquisition waited.
func contend(b *testing.B, contenders int, locker func(i int) driver.Locker, key string, fair bool) []time.Duration {
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Fair: fair}
	if lease, err := locker(0).Acquire(ctx, key, opts); err == nil { // warm the script cache
		lease.Release(ctx)
	}
	var (
		left  atomic.Int64
		mu    sync.Mutex
		waits = make([]time.Duration, 0, b.N)
		wg    sync.WaitGroup
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	for i := range contenders {
		l := locker(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				start := time.Now()
				lease, err := l.Acquire(ctx, key, opts)
				if err != nil {
					b.Error(err)
					return
				}
				waited := time.Since(start)
				time.Sleep(100 * time.Microsecond)
				if err := lease.Release(ctx); err != nil {
					b.Error(err)
				}
				mu.Lock()
				waits = append(waits, waited)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	return waits
}

// BenchmarkHeldLocks holds 10,000 locks through one Guard with a 3s ttl and
// reports the heap each held lock costs (guard's Lock and the lease) and the
// round trips to Redis per renewal period (a third of the ttl) while they
// are held: renewals go in one pipeline per period, not one per lock.
func BenchmarkHeldLocks(b *testing.B) {
	const n, ttl = 10_000, 3 * time.Second
	ctx := context.Background()
	var perLock, tripsPerPeriod float64
	for b.Loop() {
		c, count := countedClient(b)
		g, err := guard.New(newLocker(b, c), guard.WithTTL(ttl))
		if err != nil {
			b.Fatal(err)
		}
		prefix := benchKey(b)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s/%d", prefix, i)
		}
		locks := make([]*guard.Lock, n)
		before := drivertest.HeapAlloc()
		for i, k := range keys {
			if locks[i], err = g.TryLock(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
		perLock = float64(drivertest.HeapAlloc()-before) / n
		count.reset()
		const periods = 4
		time.Sleep(periods * ttl / 3)
		tripsPerPeriod = float64(count.trips.Load()) / periods
		for _, l := range locks {
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(perLock, "B/lock")
	b.ReportMetric(tripsPerPeriod, "trips/period")
}

// BenchmarkRefreshBatch: one RefreshBatch of 10,000 plain locks, as
// guard's keeper sends every period. B/lease and allocs/lease are what the
// batch allocates per lease (-benchmem's figures over the leases), most of
// it kept until the whole batch is answered: at 100,000 held locks, the
// heap a held lock costs while a renewal is in flight.
func BenchmarkRefreshBatch(b *testing.B) {
	const n = 10_000
	c, count := countedClient(b)
	l := newLocker(b, c)
	ctx := context.Background()
	prefix := benchKey(b)
	leases := make([]driver.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("%s/%d", prefix, i), driver.AcquireOptions{TTL: time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
	refresh := func() {
		for i, err := range l.RefreshBatch(ctx, leases, time.Minute) {
			if err != nil {
				b.Fatalf("lease %d: %v", i, err)
			}
		}
	}
	refresh() // the script cached on the server
	count.reset()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for range b.N {
		refresh()
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	batches := float64(b.N)
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/batches/n, "B/lease")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/batches/n, "allocs/lease")
	b.ReportMetric(float64(count.trips.Load())/batches, "trips/batch")
	for _, ls := range leases {
		ls.Release(ctx)
	}
}

// BenchmarkHandoff: 8 contenders, each with its own Locker and client as
// separate processes would have, take turns on one key, holding it for 0
// or 1ms, fair or not, as bench-peers's contended scenario does. cmds/op is the server
// commands per acquisition, read from the server's INFO commandstats (so
// exact only on a server nobody else uses: point WARDEN_REDIS_ADDR at one),
// failed attempts and the releases' work included; %retaken is the share
// of acquisitions by the contender that released the lock just before
// (barging: bsm/redislock's releaser takes the lock back 84-98% of the
// time in bench-peers, warden's 0-0.13% here, since a release hands it
// over).
func BenchmarkHandoff(b *testing.B) {
	for _, c := range []struct {
		hold time.Duration
		fair bool
	}{{0, false}, {time.Millisecond, false}, {0, true}, {time.Millisecond, true}} {
		hold := c.hold
		b.Run(fmt.Sprintf("hold=%v/fair=%v", hold, c.fair), func(b *testing.B) {
			admin := newClient(b)
			lockers := make([]driver.Locker, 8)
			for i := range lockers {
				lockers[i] = newLocker(b, newClient(b))
			}
			ctx := context.Background()
			key := benchKey(b)
			opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true, Fair: c.fair}
			if lease, err := lockers[0].Acquire(ctx, key, opts); err == nil { // warm the script cache
				lease.Release(ctx)
			}
			before := serverCalls(b, admin)
			var (
				left atomic.Int64
				wg   sync.WaitGroup
				// last is the contender that took the lock last, and
				// retaken counts the acquisitions by the contender
				// that had just released it (barging).
				last    atomic.Int64
				retaken atomic.Int64
			)
			left.Store(int64(b.N))
			last.Store(-1)
			b.ResetTimer()
			for i, l := range lockers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for left.Add(-1) >= 0 {
						lease, err := l.Acquire(ctx, key, opts)
						if err != nil {
							b.Error(err)
							return
						}
						if last.Swap(int64(i)) == int64(i) {
							retaken.Add(1)
						}
						if hold > 0 {
							time.Sleep(hold)
						}
						if err := lease.Release(ctx); err != nil {
							b.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			after := serverCalls(b, admin)
			var total int64
			by := map[string]float64{}
			for name, v := range after {
				if d := v - before[name]; d > 0 && name != "info" {
					total += d
					by[name] = float64(d) / float64(b.N)
				}
			}
			b.Logf("server commands per acquisition by command: %v", by)
			b.ReportMetric(float64(total)/float64(b.N), "cmds/op")
			b.ReportMetric(100*float64(retaken.Load())/float64(b.N), "%retaken")
		})
	}
}

// BenchmarkGuardCycle: one uncontended guard.Do over the Locker, as
// bench-peers's one-worker scenario runs it (10s TTL, waiting), for the
// client's allocations and CPU per cycle (-benchmem, -cpuprofile).
func BenchmarkGuardCycle(b *testing.B) {
	g, err := guard.New(newLocker(b, newClient(b)), guard.WithTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	key := benchKey(b)
	section := func(context.Context, *guard.Lock) error { return nil }
	if err := g.Do(ctx, key, section); err != nil { // scripts cached on the server
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Do(ctx, key, section); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCycleClient is one uncontended lock cycle on one key, with the
// client bench-peers gives every Redis subject (ContextTimeoutEnabled, a
// pool of 16), for the client's cost per cycle: through guard.Do under a
// context that can be cancelled, as bench-peers's workers run it ("guard");
// the same with the Locker declared driver.ContextBounded, which it is not
// (go-redis bounds a read by the context's deadline, not its
// cancellation), so that guard calls it on the caller's goroutine: the
// difference is what guard's hand-off of the acquisition and the release
// to its call goroutines costs ("guard-direct"); the Locker's Acquire and
// Release called directly ("locker"); and the floor, SET NX PX and an
// owner-checked DEL script by EVALSHA ("raw"). Client instructions per
// cycle are counted under callgrind (CGO_ENABLED=0, GOGC=off,
// GODEBUG=asyncpreemptoff=1) by the difference between two -benchtime
// counts; goroutines/op counts the goroutines started per cycle.
func BenchmarkCycleClient(b *testing.B) {
	addr := drivertest.Addr(b, addrEnv, addrDefault)
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 16})
	b.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(b *testing.B, cycle func() error) {
		if err := cycle(); err != nil { // connection open, scripts cached
			b.Fatal(err)
		}
		b.ReportAllocs()
		started := goroutinesStarted()
		for b.Loop() {
			if err := cycle(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(goroutinesStarted()-started)/float64(b.N), "goroutines/op")
	}
	guardCycles := func(b *testing.B, l driver.Locker) {
		g, err := guard.New(l, guard.WithTTL(10*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		key := benchKey(b)
		section := func(context.Context, *guard.Lock) error { return nil }
		run(b, func() error { return g.Do(ctx, key, section) })
	}
	b.Run("guard", func(b *testing.B) { guardCycles(b, newLocker(b, c)) })
	b.Run("guard-direct", func(b *testing.B) { guardCycles(b, directLocker{newLocker(b, c)}) })
	b.Run("locker", func(b *testing.B) {
		l := newLocker(b, c)
		key := benchKey(b)
		opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}
		run(b, func() error {
			lease, err := l.Acquire(ctx, key, opts)
			if err != nil {
				return err
			}
			return lease.Release(ctx)
		})
	})
	b.Run("raw", func(b *testing.B) {
		release := goredis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`)
		key := benchKey(b)
		run(b, func() error {
			if err := c.Do(ctx, "set", key, "owner", "px", 10000, "nx").Err(); err != nil {
				return err
			}
			n, err := release.Run(ctx, c, []string{key}, "owner").Int()
			if err == nil && n != 1 {
				err = fmt.Errorf("released %d keys", n)
			}
			return err
		})
	})
}

// goroutinesStarted is how many goroutines the process has started so far.
func goroutinesStarted() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// directLocker declares a Locker driver.ContextBounded, for
// BenchmarkCycleClient's measure of guard's hand-off; no test may rely on
// it, since a Redis client does not honour a context's cancellation.
type directLocker struct{ *Locker }

func (directLocker) BoundedByContext() bool { return true }

package guard_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// BenchmarkDo measures an uncontended Do on the memory backend with no
// telemetry provider: everything guard adds to the backend's own cost. It
// also reports x-floor, its time per op over that of the same backend's bare
// Acquire and Release run as many times right after it, since only a ratio
// from one run means anything on a shared machine.
func BenchmarkDo(b *testing.B) {
	g, err := guard.New(memory.New())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	fn := func(context.Context, *guard.Lock) error { return nil }
	b.ReportAllocs()
	start := time.Now()
	n := 0
	for b.Loop() {
		if err := g.Do(ctx, "job", fn); err != nil {
			b.Fatal(err)
		}
		n++
	}
	do := time.Since(start)
	b.StopTimer()
	l := memory.New()
	start = time.Now()
	for range n {
		acquireRelease(b, l)
	}
	b.ReportMetric(float64(do)/float64(time.Since(start)), "x-floor")
}

// BenchmarkDoHandoff is BenchmarkDo with the memory backend undeclared
// (remote: it does not declare driver.ContextBounded, as no backend over a
// network whose client ignores deadlines does) and a context that can be
// cancelled: guard hands the acquisition and the release to its call
// goroutines. Its difference from BenchmarkDo is what the hand-off costs,
// counted (callgrind, -benchmem) without a network's noise.
func BenchmarkDoHandoff(b *testing.B) {
	g, err := guard.New(remote{memory.New()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fn := func(context.Context, *guard.Lock) error { return nil }
	b.ReportAllocs()
	started := goroutinesStarted()
	for b.Loop() {
		if err := g.Do(ctx, "job", fn); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(goroutinesStarted()-started)/float64(b.N), "goroutines/op")
}

// BenchmarkBackendFloor is the floor Do is compared with: the same backend's
// acquire and release, called directly with the options Do passes (its
// default TTL, waiting).
func BenchmarkBackendFloor(b *testing.B) {
	l := memory.New()
	b.ReportAllocs()
	for b.Loop() {
		acquireRelease(b, l)
	}
}

func acquireRelease(b *testing.B, l *memory.Locker) {
	ctx := context.Background()
	lease, err := l.Acquire(ctx, "warden:job", driver.AcquireOptions{TTL: 30 * time.Second, Wait: true})
	if err != nil {
		b.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkHeldLocks holds 10,000 locks through one Guard on the memory
// backend and reports the heap each held lock costs (guard's Lock, its place
// in the keeper, the backend's lease and entry), the heap the same backend
// takes for as many leases acquired without guard (backend-B/lock), guard's
// share as their difference (guard-B/lock), and the goroutines added by
// holding them all.
func BenchmarkHeldLocks(b *testing.B) {
	heldHeap(b, func() driver.Locker { return memory.New() })
}

// heldHeap holds 10,000 locks through one Guard on a backend from
// newLocker, and the same number of leases of another without guard, and
// reports the heap per lock of each and guard's share (BenchmarkHeldLocks).
func heldHeap(b *testing.B, newLocker func() driver.Locker) {
	const n = 10_000
	ctx := context.Background()
	var perLock, backend, goroutines float64
	for b.Loop() {
		l := newLocker()
		leases := make([]driver.Lease, n)
		before := drivertest.HeapAlloc()
		for i := range leases {
			var err error
			if leases[i], err = l.Acquire(ctx, fmt.Sprintf("warden:held/%d", i), driver.AcquireOptions{TTL: 30 * time.Second}); err != nil {
				b.Fatal(err)
			}
		}
		backend = float64(drivertest.HeapAlloc()-before) / n
		for _, lease := range leases {
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}

		g, err := guard.New(newLocker(), guard.WithTTL(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("held/%d", i)
		}
		locks := make([]*guard.Lock, n)
		before, g0 := drivertest.HeapAlloc(), runtime.NumGoroutine()
		for i, k := range keys {
			if locks[i], err = g.TryLock(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
		after, g1 := drivertest.HeapAlloc(), runtime.NumGoroutine()
		perLock = float64(after-before) / n
		goroutines = float64(g1 - g0)
		for _, l := range locks {
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(perLock, "B/lock")
	b.ReportMetric(backend, "backend-B/lock")
	b.ReportMetric(perLock-backend, "guard-B/lock")
	b.ReportMetric(goroutines, "goroutines")
}

// BenchmarkDoRedis measures an uncontended Do on the Redis backend, with
// go-redis's default options: under a caller's deadline with a wait bound
// (deadline), as httpmw.Lock runs it, and under a context that never ends
// (background), as bench-peers's one-worker scenario runs it. The round trip
// dominates, and guard's bound on the call must add next to nothing to it:
// goroutines/op counts the goroutines started per cycle, which a client
// that ignores deadlines (redislock does not declare ContextBounded) makes
// guard's bound cost.
func BenchmarkDoRedis(b *testing.B) {
	addr := drivertest.Addr(b, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	b.Cleanup(func() { c.Close() })
	l, err := redislock.New(c)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	benchDoServer(b, l)
}

// BenchmarkDoPostgres is BenchmarkDoRedis on PostgreSQL through sqllock
// (gorm over pgx), another backend that does not declare ContextBounded.
func BenchmarkDoPostgres(b *testing.B) {
	dsn := os.Getenv("WARDEN_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable"
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		drivertest.Unreachable(b, "WARDEN_POSTGRES_DSN", dsn, err)
		return
	}
	if sdb, err := db.DB(); err == nil {
		b.Cleanup(func() { sdb.Close() })
	}
	l, err := sqllock.New(db)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	benchDoServer(b, l)
}

func benchDoServer(b *testing.B, l driver.Locker) {
	g, err := guard.New(l, guard.WithPrefix(fmt.Sprintf("bench-%d:", time.Now().UnixNano())), guard.WithTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	fn := func(context.Context, *guard.Lock) error { return nil }
	for _, bc := range []struct {
		name string
		opts []guard.LockOption
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"deadline", []guard.LockOption{guard.WaitAtMost(time.Second)}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Hour)
		}},
		{"background", nil, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx, cancel := bc.ctx()
			defer cancel()
			if err := g.Do(ctx, "job", fn, bc.opts...); err != nil { // scripts cached, statements prepared
				b.Fatal(err)
			}
			b.ReportAllocs()
			started := goroutinesStarted()
			for b.Loop() {
				if err := g.Do(ctx, "job", fn, bc.opts...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(goroutinesStarted()-started)/float64(b.N), "goroutines/op")
		})
	}
}

// goroutinesStarted is how many goroutines the process has started so far.
func goroutinesStarted() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// BenchmarkMutexFloor is the floor of any in-process lock: a sync.Mutex
// locked and unlocked around the same empty section, for BenchmarkDo's
// ns/op to be read against in the same run.
func BenchmarkMutexFloor(b *testing.B) {
	var mu sync.Mutex
	fn := func() {}
	b.ReportAllocs()
	for b.Loop() {
		mu.Lock()
		fn()
		mu.Unlock()
	}
}

// BenchmarkHeldLocksRedis holds WARDEN_BENCH_HELD (default 10,000) locks
// of one Guard on the Redis backend with a 3s TTL, as bench-peers'
// renewal scenario does, and reports the heap each takes: the growth of the
// live heap (after a GC) from before the first lock to 1.5 renewal periods
// after the last (settled-B/lock, the figure bench-peers reports), and the
// least and most of it sampled every tenth of the period after that
// (min-B/lock, max-B/lock: at rest, and with a renewal batch in flight).
func BenchmarkHeldLocksRedis(b *testing.B) {
	addr := drivertest.Addr(b, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	n := 10_000
	if s := os.Getenv("WARDEN_BENCH_HELD"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n <= 0 {
			b.Fatalf("WARDEN_BENCH_HELD=%q: want a positive count", s)
		}
	}
	const ttl = 3 * time.Second
	ctx := context.Background()
	var settled, least, most float64
	for b.Loop() {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		l, err := redislock.New(c)
		if err != nil {
			b.Fatal(err)
		}
		g, err := guard.New(l, guard.WithTTL(ttl), guard.WithPrefix(fmt.Sprintf("bench-held-%d:", time.Now().UnixNano())))
		if err != nil {
			b.Fatal(err)
		}
		// One cycle first, so that connections and scripts are ready.
		if err := g.Do(ctx, "warm", func(context.Context, *guard.Lock) error { return nil }); err != nil {
			b.Fatal(err)
		}
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("held/%d", i)
		}
		locks := make([]*guard.Lock, n)
		before := drivertest.HeapAlloc()
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < n; i += 16 {
					var err error
					if locks[i], err = g.Lock(ctx, keys[i]); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
		period := ttl / 3
		time.Sleep(period + period/2)
		settled = float64(drivertest.HeapAlloc()-before) / float64(n)
		least, most = settled, settled
		for range 10 {
			time.Sleep(period / 10)
			per := float64(drivertest.HeapAlloc()-before) / float64(n)
			least, most = min(least, per), max(most, per)
		}
		lost := 0
		var lostErr error
		for _, l := range locks {
			if err := l.Unlock(ctx); errors.Is(err, guard.ErrLockLost) {
				lost++
				lostErr = err
			} else if err != nil {
				b.Fatal(err)
			}
		}
		if lost > 0 {
			b.Fatalf("%d of %d locks lost, the last for %v", lost, n, lostErr)
		}
		l.Close()
		c.Close()
	}
	b.ReportMetric(settled, "settled-B/lock")
	b.ReportMetric(least, "min-B/lock")
	b.ReportMetric(most, "max-B/lock")
}

// BenchmarkHeldSessionLocks is BenchmarkHeldLocks for leases kept alive by
// one backend session (as etcd's and ZooKeeper's are): the session's
// bookkeeping is in guard's share.
func BenchmarkHeldSessionLocks(b *testing.B) {
	heldHeap(b, func() driver.Locker { return newSessionLocker(time.Hour) })
}

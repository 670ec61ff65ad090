package sqllock_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// BenchmarkAcquireRelease is one uncontended lock cycle (Acquire, Release) on
// each database.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, db := range databases() {
		b.Run(db.name, func(b *testing.B) {
			dsn := db.dsn(b)
			l := newLocker(b, migrated(b, db, dsn))
			ctx := context.Background()
			b.ResetTimer()
			lockCycles(ctx, b, l, fmt.Sprintf("bench/%d", time.Now().UnixNano()))
		})
	}
}

// BenchmarkRefresh is one refresh of one lease.
func BenchmarkRefresh(b *testing.B) {
	for _, db := range databases() {
		b.Run(db.name, func(b *testing.B) {
			dsn := db.dsn(b)
			l := newLocker(b, migrated(b, db, dsn))
			ctx := context.Background()
			lease, err := l.Acquire(ctx, fmt.Sprintf("bench/%d", time.Now().UnixNano()), driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			defer lease.Release(ctx)
			for b.Loop() {
				if err := lease.Refresh(ctx, time.Minute); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHandoff measures, on PostgreSQL, the time from a holder's Release
// to the moment a waiter of another process holds the lock, with release
// notifications ("notify") and with polling alone ("poll", WithoutNotify),
// both with the default backoff. The holder keeps the lock for handoffHold
// first, so that the polling waiter's backoff has grown as it does in use.
// It reports the median and 99th percentile in milliseconds; run it with a
// fixed count, e.g. -benchtime=100x.
func BenchmarkHandoff(b *testing.B) {
	const handoffHold = 200 * time.Millisecond
	db := postgresDB()
	for _, mode := range []string{"notify", "poll"} {
		b.Run(mode, func(b *testing.B) {
			var opts []sqllock.Option
			if mode == "poll" {
				opts = append(opts, sqllock.WithoutNotify())
			}
			dsn := db.dsn(b)
			holder := newLocker(b, migrated(b, db, dsn, opts...), opts...)
			waiter := newLocker(b, openDB(b, db, dsn), opts...)
			ctx := context.Background()
			k := fmt.Sprintf("bench/handoff/%d", time.Now().UnixNano())
			ttl := driver.AcquireOptions{TTL: time.Minute}
			var lat []time.Duration
			for b.Loop() {
				lease, err := holder.Acquire(ctx, k, ttl)
				if err != nil {
					b.Fatal(err)
				}
				type handoff struct {
					at time.Time
					result
				}
				got := make(chan handoff, 1)
				go func() {
					next, err := waiter.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
					got <- handoff{time.Now(), result{next, err}}
				}()
				time.Sleep(handoffHold)
				released := time.Now()
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
				h := <-got
				if h.err != nil {
					b.Fatal(h.err)
				}
				lat = append(lat, h.at.Sub(released))
				if err := h.lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
			slices.Sort(lat)
			pct := func(p float64) float64 {
				return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond)
			}
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(0, "ns/op") // the loop's time is mostly handoffHold
		})
	}
}

// BenchmarkHeldLocks holds 10,000 locks on PostgreSQL through one Guard with
// a 3s ttl and reports the statements sent per renewal period (a third of
// the ttl) while they are held: the keeper renews them in batches, one
// statement per batch.
func BenchmarkHeldLocks(b *testing.B) {
	const n, ttl = 10_000, 3 * time.Second
	db := postgresDB()
	dsn := db.dsn(b)
	ctx := context.Background()
	var perPeriod float64
	for b.Loop() {
		g := migrated(b, db, dsn)
		var statements atomic.Int64
		count := func(*gorm.DB) { statements.Add(1) }
		if err := g.Callback().Raw().After("gorm:raw").Register("count", count); err != nil {
			b.Fatal(err)
		}
		if err := g.Callback().Row().After("gorm:row").Register("count", count); err != nil {
			b.Fatal(err)
		}
		gd, err := guard.New(newLocker(b, g), guard.WithTTL(ttl))
		if err != nil {
			b.Fatal(err)
		}
		prefix := fmt.Sprintf("bench/held/%d", time.Now().UnixNano())
		locks := make([]*guard.Lock, n)
		for i := range locks {
			if locks[i], err = gd.TryLock(ctx, fmt.Sprintf("%s/%d", prefix, i)); err != nil {
				b.Fatal(err)
			}
		}
		statements.Store(0)
		const periods = 4
		time.Sleep(periods * ttl / 3)
		perPeriod = float64(statements.Load()) / periods
		for _, l := range locks {
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(perPeriod, "statements/period")
}

// BenchmarkHeldLeases holds 10,000 leases of one Locker on PostgreSQL and
// reports the heap they keep, in bytes per lease: held, once taken;
// renewed, after one batch renewal of them all (which leaves what the
// Locker and the driver keep from it); and the bytes that renewal
// allocated, an upper bound of what it holds in flight. The caller owns
// the keys, which are not counted; renewed counts what pgx keeps of the
// statement's parameters on its connection until that connection's next
// statement, about twice their size.
func BenchmarkHeldLeases(b *testing.B) {
	const n, workers = 10_000, 16
	db := postgresDB()
	dsn := db.dsn(b)
	ctx := context.Background()
	var held, renewed, alloc float64
	for b.Loop() {
		l := newLocker(b, migrated(b, db, dsn))
		prefix := fmt.Sprintf("bench/leases/%d", time.Now().UnixNano())
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s/%d", prefix, i)
		}
		leases := make([]driver.Lease, n)
		var m0, m1, m2 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				for i := w; i < n; i += workers {
					lease, err := l.Acquire(ctx, keys[i], driver.AcquireOptions{TTL: time.Minute, Owner: "bench"})
					if err != nil {
						errs <- err
						return
					}
					leases[i] = lease
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		for i, err := range l.RefreshBatch(ctx, leases, time.Minute) {
			if err != nil {
				b.Fatalf("lease %d: %v", i, err)
			}
		}
		runtime.ReadMemStats(&m2)
		alloc = float64(m2.TotalAlloc-m1.TotalAlloc) / n
		runtime.GC()
		runtime.ReadMemStats(&m2)
		held = (float64(m1.HeapAlloc) - float64(m0.HeapAlloc)) / n
		renewed = (float64(m2.HeapAlloc) - float64(m0.HeapAlloc)) / n
		for _, lease := range leases {
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		runtime.KeepAlive(leases)
	}
	b.ReportMetric(held, "held-B/lease")
	b.ReportMetric(renewed, "renewed-B/lease")
	b.ReportMetric(alloc, "renewal-alloc-B/lease")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkContended has 8 Lockers, each on its own client as separate
// processes would be, take and release one key in a loop with no hold, on
// PostgreSQL. Beside the time per acquisition it reports how often the
// releaser took the lock back at once (back), the time from a release's
// return to the next grant's return when another Locker got it (handoff
// p50, in microseconds), and the waiters woken by a notification per
// acquisition. Statements by kind are the server's to count
// (pg_stat_statements).
func BenchmarkContended(b *testing.B) {
	const contenders = 8
	db := postgresDB()
	dsn := db.dsn(b)
	lockers := make([]*sqllock.Locker, contenders)
	lockers[0] = newLocker(b, migrated(b, db, dsn))
	for i := 1; i < contenders; i++ {
		lockers[i] = newLocker(b, openDB(b, db, dsn))
	}
	ctx := context.Background()
	k := fmt.Sprintf("bench/contended/%d", time.Now().UnixNano())
	var (
		mu       sync.Mutex
		last     = -1 // the Locker that released last
		released time.Time
		back     int
		handoffs []time.Duration
		left     atomic.Int64
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, l := range lockers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
				if err != nil {
					b.Error(err)
					return
				}
				now := time.Now()
				mu.Lock()
				if last == i {
					back++
				} else if last >= 0 {
					handoffs = append(handoffs, now.Sub(released))
				}
				mu.Unlock()
				// Recorded before the release, which the next grant
				// follows; the time is taken after it.
				mu.Lock()
				last = i
				mu.Unlock()
				err = lease.Release(ctx)
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	var woken uint64
	for _, l := range lockers {
		_, _, w := sqllock.ListenStats(l)
		woken += w
	}
	b.ReportMetric(float64(back)/float64(b.N), "back")
	b.ReportMetric(float64(woken)/float64(b.N), "woken/op")
	if len(handoffs) > 0 {
		slices.Sort(handoffs)
		b.ReportMetric(float64(handoffs[len(handoffs)/2])/float64(time.Microsecond), "handoff-p50-us")
		b.ReportMetric(float64(len(handoffs))/float64(b.N), "handoffs/op")
	}
}

// lockCycles takes and releases k on l until b has looped enough.
func lockCycles(ctx context.Context, b *testing.B, l driver.Locker, k string) {
	for b.Loop() {
		lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

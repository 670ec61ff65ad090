package sqllock_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	sqllock "github.com/warden-go/warden/backends/sql"
	"github.com/warden-go/warden/guard"
)

// BenchmarkAcquireRelease is one uncontended lock cycle (Acquire, Release) on
// each database, in each mode it has.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, db := range databases() {
		modes := []string{"lease"}
		if db.sessions {
			modes = append(modes, "session")
		}
		for _, mode := range modes {
			b.Run(db.name+"/"+mode, func(b *testing.B) {
				var opts []sqllock.Option
				if mode == "session" {
					opts = []sqllock.Option{sqllock.WithSessionLocks(), sqllock.WithTable(sessionTable)}
				}
				dsn := db.dsn(b)
				l := newLocker(b, migrated(b, db, dsn, opts...), opts...)
				ctx := context.Background()
				k := fmt.Sprintf("bench/%d", time.Now().UnixNano())
				b.ResetTimer()
				for b.Loop() {
					lease, err := l.Acquire(ctx, k, guard.AcquireOptions{TTL: time.Minute})
					if err != nil {
						b.Fatal(err)
					}
					if err := lease.Release(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkRefresh is one lease-mode refresh, the watchdog's steady cost.
func BenchmarkRefresh(b *testing.B) {
	for _, db := range databases() {
		b.Run(db.name, func(b *testing.B) {
			dsn := db.dsn(b)
			l := newLocker(b, migrated(b, db, dsn))
			ctx := context.Background()
			lease, err := l.Acquire(ctx, fmt.Sprintf("bench/%d", time.Now().UnixNano()), guard.AcquireOptions{TTL: time.Minute})
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
		for _, lock := range []string{"lease", "session"} {
			b.Run(mode+"/"+lock, func(b *testing.B) {
				var opts []sqllock.Option
				if lock == "session" {
					opts = append(opts, sqllock.WithSessionLocks(), sqllock.WithTable(sessionTable))
				}
				if mode == "poll" {
					opts = append(opts, sqllock.WithoutNotify())
				}
				dsn := db.dsn(b)
				holder := newLocker(b, migrated(b, db, dsn, opts...), opts...)
				waiter := newLocker(b, openDB(b, db, dsn), opts...)
				ctx := context.Background()
				k := fmt.Sprintf("bench/handoff/%d", time.Now().UnixNano())
				ttl := guard.AcquireOptions{TTL: time.Minute}
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
						next, err := waiter.Acquire(ctx, k, guard.AcquireOptions{TTL: time.Minute, Wait: true})
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
}

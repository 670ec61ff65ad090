package sqllock_test

import (
	"context"
	"fmt"
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

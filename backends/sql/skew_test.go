package sqllock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sqllock "github.com/warden-go/warden/backends/sql"
	"github.com/warden-go/warden/guard"
)

// TestSkewedClocks runs clients whose application clocks disagree by
// minutes. Every instant the package reads from the application goes through
// WithClock, so an implementation that judged expiry by the application
// clock (lock_until = app now + ttl, compared with app now) would fail here:
// the client seven minutes ahead would see every lease as expired and take
// it over, and the one behind would never see an expired lease as such.
func TestSkewedClocks(t *testing.T) {
	const skew = 7 * time.Minute
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			migrated(t, db, dsn)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			client := func(offset time.Duration) *sqllock.Locker {
				return newLocker(t, openDB(t, db, dsn), sqllock.WithClock(func() time.Time { return time.Now().Add(offset) }))
			}
			ahead, exact, behind := client(skew), client(0), client(-skew)
			all := []*sqllock.Locker{ahead, exact, behind}
			long := guard.AcquireOptions{TTL: time.Minute}

			// Whoever holds, nobody else gets in, whatever their clock says.
			for i, holder := range all {
				k := uniqueKey(t)
				lease, err := holder.Acquire(ctx, k, long)
				if err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
				for j, other := range all {
					if _, err := other.Acquire(ctx, k, long); !errors.Is(err, guard.ErrNotAcquired) {
						t.Errorf("client %d (clock %v) while client %d (clock %v) holds: got %v, want ErrNotAcquired",
							j, offsetOf(j, skew), i, offsetOf(i, skew), err)
					}
				}
				if err := lease.Refresh(ctx, time.Minute); err != nil {
					t.Errorf("client %d: Refresh: %v", i, err)
				}
				select {
				case <-lease.Done():
					t.Errorf("client %d: Done closed on a live lease", i)
				default:
				}
				if err := lease.Release(ctx); err != nil {
					t.Errorf("client %d: Release: %v", i, err)
				}
			}

			// A lease left to expire is taken over after its TTL, not before
			// and not minutes later, by a client whose clock is behind.
			ttl := 500 * time.Millisecond
			k := uniqueKey(t)
			abandoned, err := ahead.Acquire(ctx, k, guard.AcquireOptions{TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			next, err := behind.Acquire(ctx, k, guard.AcquireOptions{TTL: ttl, Wait: true})
			if err != nil {
				t.Fatalf("behind client waiting for an expired lease: %v", err)
			}
			if waited := time.Since(start); waited < ttl/2 {
				t.Errorf("expired lease taken over after %v, before half its TTL %v", waited, ttl)
			}
			if next.Token() <= abandoned.Token() {
				t.Errorf("token %d after %d", next.Token(), abandoned.Token())
			}
			next.Release(ctx)

			// Contention among the three, with short leases refreshed by nobody.
			var (
				inside atomic.Int32
				mu     sync.Mutex
				last   uint64
				wg     sync.WaitGroup
			)
			k = uniqueKey(t)
			for i, l := range all {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 6 {
						lease, err := l.Acquire(ctx, k, guard.AcquireOptions{TTL: 5 * time.Second, Wait: true})
						if err != nil {
							t.Errorf("client %d: %v", i, err)
							return
						}
						if n := inside.Add(1); n != 1 {
							t.Errorf("%d holders at once", n)
						}
						mu.Lock()
						if lease.Token() <= last {
							t.Errorf("token %d after %d", lease.Token(), last)
						}
						last = lease.Token()
						mu.Unlock()
						time.Sleep(time.Millisecond)
						inside.Add(-1)
						if err := lease.Release(context.Background()); err != nil {
							t.Errorf("client %d: Release: %v", i, err)
						}
					}
				}()
			}
			wg.Wait()
		})
	}
}

func offsetOf(i int, skew time.Duration) time.Duration { return []time.Duration{skew, 0, -skew}[i] }

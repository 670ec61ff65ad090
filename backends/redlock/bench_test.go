package redlock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// BenchmarkAcquireRelease: an uncontended acquisition and release on the
// shared nodes, for the client's allocations per cycle (-benchmem).
func BenchmarkAcquireRelease(b *testing.B) {
	l := sharedLocker(b)
	ctx := context.Background()
	key := "bench/acquire-release/" + time.Now().Format(time.RFC3339Nano)
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}
	b.ReportAllocs()
	for b.Loop() {
		lease, err := l.Acquire(ctx, key, opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

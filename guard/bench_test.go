package guard_test

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// BenchmarkDo measures an uncontended Do on the memory backend with no
// telemetry provider: everything guard adds to the backend's own cost.
func BenchmarkDo(b *testing.B) {
	g, err := guard.New(memory.New())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	fn := func(context.Context, *guard.Lock) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Do(ctx, "job", fn); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBackendFloor is the floor Do is compared with: the same backend's
// acquire and release, called directly.
func BenchmarkBackendFloor(b *testing.B) {
	l := memory.New()
	ctx := context.Background()
	o := driver.AcquireOptions{TTL: 30 * time.Second}
	b.ReportAllocs()
	for b.Loop() {
		lease, err := l.Acquire(ctx, "warden:job", o)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

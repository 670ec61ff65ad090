package redlock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
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

// BenchmarkGuardCycle: one uncontended guard.Do over the Locker, as
// bench-peers's one-worker scenario runs it (10s TTL, waiting, under a
// context that can be cancelled), for the client's cost per cycle:
// allocations (-benchmem), and instructions under callgrind
// (CGO_ENABLED=0, GOGC=off, GODEBUG=asyncpreemptoff=1) by the difference
// between two -benchtime counts.
func BenchmarkGuardCycle(b *testing.B) {
	g, err := guard.New(sharedLocker(b), guard.WithTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := "bench/guard-cycle/" + time.Now().Format(time.RFC3339Nano)
	section := func(context.Context, *guard.Lock) error { return nil }
	if err := g.Do(ctx, key, section); err != nil { // connections open, fences learnt
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Do(ctx, key, section); err != nil {
			b.Fatal(err)
		}
	}
}

package idempotency_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"github.com/warden-go/warden/idempotency"
)

// undeclared is the memory store without its ContextBounded declaration,
// as every store over a network is: the Executor calls it on goroutines of
// its own.
type undeclared struct{ idempotency.Store }

// BenchmarkDo measures the Executor's own cost over the memory store, the
// cheapest store there is: a first call (claim, run, complete) and a
// replay (one claim answered with the stored record), with the store
// called on the caller's goroutine (memory) and on goroutines of the
// Executor's (undeclared, the path of the network stores).
func BenchmarkDo(b *testing.B) {
	for _, tc := range []struct {
		name  string
		store idempotency.Store
	}{{"memory", idempotency.NewMemoryStore()}, {"undeclared", undeclared{idempotency.NewMemoryStore()}}} {
		b.Run(tc.name, func(b *testing.B) {
			e, err := idempotency.New(tc.store, idempotency.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			fn := func(context.Context) ([]byte, error) { return []byte(`{"id":"ord_1"}`), nil }
			i := 0 // outside the sub-benchmark, so that reruns with -count use fresh keys too
			b.Run("first", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					i++
					if _, err := e.Do(ctx, "first-"+strconv.Itoa(i), "fp", fn); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("replay", func(b *testing.B) {
				if _, err := e.Do(ctx, "replayed", "fp", fn); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if res, err := e.Do(ctx, "replayed", "fp", fn); err != nil || !res.Replayed {
						b.Fatal(res, err)
					}
				}
			})
		})
	}
}

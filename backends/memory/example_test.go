package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
)

// The in-process backend serves programs that run as one process: a
// semaphore bounding concurrent exports to two.
func Example() {
	g, err := guard.New(memory.New(), guard.WithTTL(30*time.Second))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	a, _ := g.TryLock(ctx, "exports", guard.Permits(2))
	b, _ := g.TryLock(ctx, "exports", guard.Permits(2))
	_, err = g.TryLock(ctx, "exports", guard.Permits(2))
	fmt.Println("third export:", err != nil)
	a.Unlock(ctx)
	b.Unlock(ctx)
	// Output: third export: true
}

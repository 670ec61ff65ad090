package fence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
)

// ledger stands for storage of your own that checks fencing tokens: it
// keeps each resource's highest accepted token, and the check, the advance
// and the write happen under one lock, as an engine's fenced write does in
// one atomic operation.
type ledger struct {
	mu      sync.Mutex
	highest map[string]uint64
	balance int
}

func (d *ledger) add(c fence.Claim, amount int) error {
	if err := c.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if h := d.highest[c.Resource]; c.Token < h {
		return fence.Stale(c, h)
	}
	d.highest[c.Resource] = c.Token
	d.balance += amount
	return nil
}

// A holder paused past its lease writes with its old token after the next
// holder wrote with a newer one: the storage refuses the late write.
func Example() {
	g, err := guard.New(memory.New())
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	d := &ledger{highest: map[string]uint64{}}

	// The first holder's claim, kept past its lock as a stalled holder's
	// write would carry it. fence.FromContext gives the claim of the lock
	// Do holds; fence.Of(l) gives the same.
	var paused fence.Claim
	_ = g.Do(ctx, "account:42", func(ctx context.Context, l *guard.Lock) error {
		paused, _ = fence.FromContext(ctx)
		return nil
	})
	// The next holder writes.
	_ = g.Do(ctx, "account:42", func(ctx context.Context, l *guard.Lock) error {
		return d.add(fence.Of(l), 10)
	})
	// The first one wakes up and writes late.
	err = d.add(paused, 10)
	fmt.Println("late write refused:", errors.Is(err, fence.ErrStaleToken), "lock lost:", errors.Is(err, guard.ErrLockLost))
	fmt.Println("balance:", d.balance, "highest token seen is the newer:", fence.Highest(err) > paused.Token)
	// Output:
	// late write refused: true lock lost: true
	// balance: 10 highest token seen is the newer: true
}

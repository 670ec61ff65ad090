package guard_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// A critical section: Do takes the lock, keeps it alive while fn runs, and
// releases it when fn returns. fn's context is cancelled if the lock is lost.
func ExampleGuard_Do() {
	g, err := guard.New(memory.New(), guard.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	err = g.Do(context.Background(), "reports/daily", func(ctx context.Context, l *guard.Lock) error {
		fmt.Println("sending the report under token", l.Token())
		return ctx.Err()
	}, guard.WaitAtMost(time.Second))
	fmt.Println("err:", err)
	// Output:
	// sending the report under token 1
	// err: <nil>
}

// TryLock gives up at once when the lock is held elsewhere.
func ExampleGuard_TryLock() {
	g, _ := guard.New(memory.New())
	ctx := context.Background()
	held, _ := g.Lock(ctx, "orders/close")
	defer held.Unlock(ctx)

	_, err := g.TryLock(ctx, "orders/close")
	fmt.Println(errors.Is(err, guard.ErrNotAcquired))
	// Output: true
}

// A nested acquisition with the holder's context is reentrant: it gets the
// same lock, and the lease is released by the outermost unlock.
func ExampleGuard_Lock_reentrant() {
	g, _ := guard.New(memory.New())
	ctx := context.Background()
	outer, _ := g.Lock(ctx, "account/42")
	inner, _ := g.Lock(outer.Context(), "account/42")
	fmt.Println(inner == outer)
	inner.Unlock(ctx)
	outer.Unlock(ctx)
	// Output: true
}

// DoAll takes several keys all or nothing, in one fixed order, so callers
// naming them in different orders cannot deadlock.
func ExampleGuard_DoAll() {
	g, _ := guard.New(memory.New())
	err := g.DoAll(context.Background(), []string{"account/9", "account/3"}, func(ctx context.Context, locks []*guard.Lock) error {
		for _, l := range locks {
			fmt.Println(l.Key())
		}
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// account/3
	// account/9
	// err: <nil>
}

// partitioned is the in-process backend behind a network that has just been
// cut: leases are granted, but no renewal gets through any more.
type partitioned struct{ *memory.Locker }

func (p partitioned) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	l, err := p.Locker.Acquire(ctx, key, o)
	if err != nil {
		return nil, err
	}
	return cutLease{l}, nil
}

type cutLease struct{ driver.Lease }

func (cutLease) Refresh(context.Context, time.Duration) error {
	return fmt.Errorf("%w: connection reset", driver.ErrUnavailable)
}

// What a section sees when its lock is lost: when no renewal could confirm
// the lease, its context is cancelled a safety margin before the lease could
// expire on the server, with cause ErrLockLost, and Do reports the loss even
// if the section returns nil. The section must stop writing at once; a
// fencing token in every write protects the data if it does not.
func ExampleGuard_Do_lost() {
	g, _ := guard.New(partitioned{memory.New()}, guard.WithTTL(300*time.Millisecond))
	err := g.Do(context.Background(), "ledger", func(ctx context.Context, l *guard.Lock) error {
		<-ctx.Done() // a real section checks ctx between steps
		fmt.Println("section stopped; cause is ErrLockLost:", errors.Is(context.Cause(ctx), guard.ErrLockLost))
		return nil
	})
	fmt.Println("Do reports the loss:", errors.Is(err, guard.ErrLockLost))
	// Output:
	// section stopped; cause is ErrLockLost: true
	// Do reports the loss: true
}

package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
)

// AcquireRead takes a read lease on key: any number of readers hold it at
// once, but not while a writer holds it or waits for it. Fair mode is not
// offered for read/write locks (guard.ErrUnsupported).
func (l *Locker) AcquireRead(ctx context.Context, key string, opts guard.AcquireOptions) (guard.Lease, error) {
	if err := l.checkShared(ctx, opts); err != nil {
		return nil, err
	}
	k := l.keys(key)
	owner := newOwner()
	ttl := opts.TTL.Milliseconds()
	ls := &lease{l: l, key: key, owner: owner, kind: kindRead, keys: k}
	return l.acquire(ctx, key, k.channel, opts.Wait, ls, waiter{
		ttl:    opts.TTL,
		shared: true,
		attempt: func(ctx context.Context, sc goredis.Scripter, _ bool) ([]int64, error) {
			return run(ctx, sc, l.s.readAcquire, []string{k.readers, k.writer, k.writeWaiters, k.fence}, owner, ttl)
		},
		cleanup: func(ctx context.Context) {
			l.s.zrelease.Run(ctx, l.client, []string{k.readers}, owner, k.channel, "0")
		},
	})
}

// AcquireWrite takes the write lease on key: one writer, and no readers. A
// writer that waits keeps new readers out, so a stream of readers cannot
// starve it.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts guard.AcquireOptions) (guard.Lease, error) {
	if err := l.checkShared(ctx, opts); err != nil {
		return nil, err
	}
	k := l.keys(key)
	owner := newOwner()
	ttl := opts.TTL.Milliseconds()
	waitMs := l.waiterTimeout.Milliseconds()
	ls := &lease{l: l, key: key, owner: owner, kind: kindWrite, keys: k}
	return l.acquire(ctx, key, k.channel, opts.Wait, ls, waiter{
		ttl:       opts.TTL,
		keepAlive: l.waiterTimeout / 3,
		attempt: func(ctx context.Context, sc goredis.Scripter, queued bool) ([]int64, error) {
			return run(ctx, sc, l.s.writeAcquire, []string{k.readers, k.writer, k.writeWaiters, k.fence}, owner, ttl, flag(queued), waitMs)
		},
		cleanup: func(ctx context.Context) {
			l.s.writeRelease.Run(ctx, l.client, []string{k.writer}, owner, k.channel)
			l.s.unwait.Run(ctx, l.client, []string{k.writeWaiters}, owner, k.channel)
		},
	})
}

// AcquireSemaphore takes one of permits permits on key. Each permit is a
// lease of its own, expiring unless refreshed, so a crashed holder's permit
// comes back. All holders of a key must agree on permits. Fair mode is not
// offered for semaphores (guard.ErrUnsupported).
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, permits int, opts guard.AcquireOptions) (guard.Lease, error) {
	if err := l.checkShared(ctx, opts); err != nil {
		return nil, err
	}
	if permits < 1 {
		return nil, fmt.Errorf("%w: %d permits", guard.ErrInvalidOption, permits)
	}
	k := l.keys(key)
	owner := newOwner()
	ttl := opts.TTL.Milliseconds()
	ls := &lease{l: l, key: key, owner: owner, kind: kindPermit, keys: k}
	return l.acquire(ctx, key, k.channel, opts.Wait, ls, waiter{
		ttl: opts.TTL,
		attempt: func(ctx context.Context, sc goredis.Scripter, _ bool) ([]int64, error) {
			return run(ctx, sc, l.s.semAcquire, []string{k.permits, k.fence}, owner, ttl, permits)
		},
		cleanup: func(ctx context.Context) {
			l.s.zrelease.Run(ctx, l.client, []string{k.permits}, owner, k.channel, "1")
		},
	})
}

func (l *Locker) checkShared(ctx context.Context, opts guard.AcquireOptions) error {
	if err := l.check(ctx, opts); err != nil {
		return err
	}
	if opts.Fair {
		return fmt.Errorf("%w: fair mode for read/write locks and semaphores", guard.ErrUnsupported)
	}
	return nil
}

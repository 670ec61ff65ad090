package redislock

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// AcquireRead implements driver.RWLocker: any number of readers hold key at
// once, but not while a writer holds it or waits for it. Fair mode is not
// offered for read/write locks (driver.ErrUnsupported).
func (l *Locker) AcquireRead(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	if err := unfair(opts); err != nil {
		return nil, err
	}
	n := namesOf(key)
	owner := ownerID(opts.Owner)
	px := pxOf(opts.TTL)
	channel := n.channel()
	keys := []string{n.readers(), n.writer(), n.writeWaiters(), n.fence()}
	ls := &lease{l: l, key: key, owner: owner, kind: kindRead}
	return l.acquire(ctx, channel, opts, ls, waiter{
		shared: true,
		contender: &funcs{try: func(ctx context.Context, sc goredis.Scripter, _ bool) (reply, error) {
			return run(ctx, sc, l.s.readAcquire, keys, owner, px)
		}, clean: func(ctx context.Context) error {
			return l.s.zrelease.Run(ctx, l.sc, keys[:1], owner, channel, "0").Err()
		}},
	})
}

// AcquireWrite implements driver.RWLocker: one writer, and no readers. A
// writer that waits keeps new readers out, so a stream of readers cannot
// starve it.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	if err := unfair(opts); err != nil {
		return nil, err
	}
	n := namesOf(key)
	owner := ownerID(opts.Owner)
	px := pxOf(opts.TTL)
	waitMs := l.cfg.waiterTimeout.Milliseconds()
	channel := n.channel()
	keys := []string{n.readers(), n.writer(), n.writeWaiters(), n.fence()}
	ls := &lease{l: l, key: key, owner: owner, kind: kindWrite}
	return l.acquire(ctx, channel, opts, ls, waiter{
		keepAlive: l.cfg.waiterTimeout / 3,
		contender: &funcs{try: func(ctx context.Context, sc goredis.Scripter, queued bool) (reply, error) {
			return run(ctx, sc, l.s.writeAcquire, keys, owner, px, flag(queued), waitMs)
		}, clean: func(ctx context.Context) error {
			return errors.Join(
				l.s.writeRelease.Run(ctx, l.sc, keys[1:2], owner, channel).Err(),
				l.s.unwait.Run(ctx, l.sc, keys[2:3], owner, channel).Err())
		}},
	})
}

// AcquireSemaphore implements driver.Semaphorer: up to permits leases hold
// key at once. Each permit is a lease of its own, expiring unless refreshed,
// so a crashed holder's permit comes back. All holders of a key must agree
// on permits. Fair mode is not offered for semaphores
// (driver.ErrUnsupported).
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, permits int, opts driver.AcquireOptions) (driver.Lease, error) {
	if err := unfair(opts); err != nil {
		return nil, err
	}
	if permits < 1 {
		return nil, fmt.Errorf("%w: %d permits", driver.ErrInvalidOption, permits)
	}
	n := namesOf(key)
	owner := ownerID(opts.Owner)
	px := pxOf(opts.TTL)
	channel := n.channel()
	keys := []string{n.permits(), n.fence()}
	ls := &lease{l: l, key: key, owner: owner, kind: kindPermit}
	return l.acquire(ctx, channel, opts, ls, waiter{
		contender: &funcs{try: func(ctx context.Context, sc goredis.Scripter, _ bool) (reply, error) {
			return run(ctx, sc, l.s.semAcquire, keys, owner, px, permits)
		}, clean: func(ctx context.Context) error {
			return l.s.zrelease.Run(ctx, l.sc, keys[:1], owner, channel, "1").Err()
		}},
	})
}

func unfair(opts driver.AcquireOptions) error {
	if opts.Fair {
		return fmt.Errorf("%w: fair mode for read/write locks and semaphores", driver.ErrUnsupported)
	}
	return nil
}

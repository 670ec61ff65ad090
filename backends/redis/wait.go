package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
)

// waiter describes how to contend for one kind of lease.
type waiter struct {
	// id names a fair waiter, whom a release message can address; "" for a
	// waiter that any release may wake.
	id string
	// keepAlive, when set, is how often a waiting contender comes back to
	// renew its recorded place (fair queue, waiting writer).
	keepAlive time.Duration
	// ttl is the TTL asked for: without better knowledge, how long a lease
	// may block this waiter.
	ttl time.Duration
	// shared: after this waiter gets in, the next local waiter may too
	// (readers), so the wake-up is passed on.
	shared bool
	// attempt runs the acquisition script once; queued asks it to record
	// the contender as waiting when it fails. It answers {1, token} or
	// {0, ms until the blocking lease lapses (negative when unknown)}.
	attempt func(ctx context.Context, sc goredis.Scripter, queued bool) ([]int64, error)
	// cleanup removes whatever an interrupted wait may have left on the
	// server (a queued place, a lock granted after ctx ended).
	cleanup func(ctx context.Context)
}

// cleanupTimeout bounds the best-effort cleanup after a cancelled wait.
const cleanupTimeout = 2 * time.Second

// acquire contends for a lease. Without wait it makes one attempt. With wait
// it sleeps between attempts until a release message wakes it, or until the
// blocking lease would have expired (so a lost message costs at most that),
// or, for waiters with a recorded place, until it is time to renew it.
func (l *Locker) acquire(ctx context.Context, key, channel string, wait bool, ls *lease, w waiter) (_ guard.Lease, err error) {
	var (
		sub    *subscription
		wake   <-chan struct{}
		queued bool
	)
	if wait {
		sub, wake, queued = l.notify.joinIfActive(channel, w.id)
		// Behind local waiters, a non-fair newcomer waits its turn for a
		// release message instead of trying at once: otherwise each
		// release would cost a failed attempt by the waiter it woke.
		queued = queued && w.id == ""
	}
	woken := false
	defer func() {
		if err != nil && !errors.Is(err, guard.ErrNotAcquired) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			w.cleanup(cctx)
			cancel()
		}
		if sub != nil {
			l.notify.leave(sub, w.id, (err != nil && woken) || (err == nil && w.shared))
		}
	}()
	for {
		if queued {
			queued = false
			if !sleep(ctx, wake, w.ttl, &woken) {
				return nil, ctx.Err()
			}
		}
		got, r, err := l.attempt(ctx, ls, w, wait)
		if err != nil {
			return nil, err
		}
		if got {
			return ls, nil
		}
		if !wait {
			return nil, fmt.Errorf("%w: %q", guard.ErrNotAcquired, key)
		}
		if sub == nil {
			if sub, wake, err = l.notify.join(ctx, channel, w.id); err != nil {
				return nil, err
			}
			// A release may have been published before the subscription
			// took effect: look again before sleeping.
			woken = false
			continue
		}
		if !sleep(ctx, wake, retryDelay(r[1], w.keepAlive), &woken) {
			return nil, ctx.Err()
		}
	}
}

// sleep waits for a wake-up or d, and reports false when ctx ended first.
func sleep(ctx context.Context, wake <-chan struct{}, d time.Duration, woken *bool) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
		*woken = true
	case <-timer.C:
		*woken = false
	}
	return true
}

// retryDelay turns the server's hint (ms until the blocking lease lapses) into
// how long to sleep when no message comes.
func retryDelay(pttl int64, keepAlive time.Duration) time.Duration {
	d := time.Duration(pttl)*time.Millisecond + time.Millisecond
	if pttl < 0 {
		// The lock was free but not ours (a fair waiter ahead) or vanished
		// just after the attempt.
		d = 10 * time.Millisecond
		if keepAlive > 0 {
			d = keepAlive
		}
	}
	if keepAlive > 0 && d > keepAlive {
		d = keepAlive
	}
	return d
}

// attempt makes one acquisition attempt. With WithWaitReplicas it runs on a
// connection of its own, because WAIT counts the replicas that acknowledged
// the writes of the connection it is sent on.
func (l *Locker) attempt(ctx context.Context, ls *lease, w waiter, queued bool) (bool, []int64, error) {
	if l.replicas == 0 {
		r, err := w.attempt(ctx, l.client, queued)
		if err != nil || r[0] != 1 {
			return false, r, err
		}
		ls.token = uint64(r[1])
		return true, r, nil
	}
	var conn *goredis.Conn
	switch c := l.client.(type) {
	case *goredis.Client:
		conn = c.Conn()
	case *goredis.ClusterClient:
		node, err := c.MasterForKey(ctx, ls.keys.fence)
		if err != nil {
			return false, nil, unavailable(ctx, err)
		}
		conn = node.Conn()
	default:
		return false, nil, fmt.Errorf("%w: WithWaitReplicas with a %T", guard.ErrUnsupported, l.client)
	}
	defer conn.Close()
	r, err := w.attempt(ctx, conn, queued)
	if err != nil || r[0] != 1 {
		return false, r, err
	}
	ls.token = uint64(r[1])
	acked, err := conn.Wait(ctx, l.replicas, l.replicaWait).Result()
	if err == nil && acked >= int64(l.replicas) {
		return true, r, nil
	}
	if err == nil {
		err = fmt.Errorf("%d of %d replicas acknowledged the lock within %v", acked, l.replicas, l.replicaWait)
	}
	// The lock must not outlive the failed acquisition.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	ls.releaseOn(rctx, conn)
	return false, nil, unavailable(ctx, err)
}

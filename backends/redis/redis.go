package redis

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/warden-go/warden/backends/internal/redistag"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
)

// Locker is a warden lock backend on one Redis deployment: a single server,
// a Sentinel-managed primary or a Cluster (any goredis.UniversalClient). It
// implements guard.Locker, guard.RWLocker, guard.Semaphorer and
// guard.BatchRefresher. It is safe for concurrent use.
type Locker struct {
	client        goredis.UniversalClient
	prefix        string
	waiterTimeout time.Duration
	replicas      int
	replicaWait   time.Duration
	optErr        error
	s             *scripts
	notify        *notifier
}

// Option configures a Locker.
type Option func(*Locker)

// WithPrefix sets the prefix of every Redis key and channel the Locker uses
// (default "warden:"), so that several applications can share a server.
func WithPrefix(prefix string) Option {
	return func(l *Locker) { l.prefix = redistag.Escape(prefix) }
}

// WithWaiterTimeout sets how long a fair waiter, or a writer waiting for
// readers, keeps its place without coming back (default 5s). A waiting
// process renews its place every third of it; a crashed one loses its place
// after it, so it bounds how long a crashed waiter can hold up the queue.
func WithWaiterTimeout(d time.Duration) Option {
	return func(l *Locker) {
		if d < 3*time.Millisecond {
			l.optErr = fmt.Errorf("%w: waiter timeout %v, want at least 3ms", guard.ErrInvalidOption, d)
			return
		}
		l.waiterTimeout = d
	}
}

// WithWaitReplicas makes every acquisition wait, with the WAIT command, until
// n replicas have acknowledged it or timeout passes; when fewer acknowledge,
// the lock is released again and Acquire fails with guard.ErrUnavailable.
//
// It narrows, but does not close, the window in which a failover promotes a
// replica that never saw the lock: WAIT does not make Redis replication
// strongly consistent, and a replica that acknowledged can still lose the
// write if it restarts without persistence. It costs one more round trip per
// acquisition and is supported for *goredis.Client (single node, Sentinel)
// and *goredis.ClusterClient.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(l *Locker) {
		if n < 1 || timeout <= 0 {
			l.optErr = fmt.Errorf("%w: WAIT for %d replicas within %v", guard.ErrInvalidOption, n, timeout)
			return
		}
		l.replicas, l.replicaWait = n, timeout
	}
}

// New returns a Locker that keeps its locks on client. The caller keeps
// ownership of client and closes it after the Locker's last use. An invalid
// option makes every call fail with an error wrapping guard.ErrInvalidOption.
func New(client goredis.UniversalClient, opts ...Option) *Locker {
	l := &Locker{
		client:        client,
		prefix:        "warden:",
		waiterTimeout: 5 * time.Second,
		s:             newScripts(),
	}
	for _, o := range opts {
		o(l)
	}
	l.notify = newNotifier(client)
	return l
}

var (
	_ guard.Locker         = (*Locker)(nil)
	_ guard.RWLocker       = (*Locker)(nil)
	_ guard.Semaphorer     = (*Locker)(nil)
	_ guard.BatchRefresher = (*Locker)(nil)
)

// Acquire takes the exclusive lock on key. With opts.Fair the lock goes to
// waiters in the order they arrived.
func (l *Locker) Acquire(ctx context.Context, key string, opts guard.AcquireOptions) (guard.Lease, error) {
	if err := l.check(ctx, opts); err != nil {
		return nil, err
	}
	k := l.keys(key)
	owner := newOwner()
	ttl := opts.TTL.Milliseconds()
	lease := &lease{l: l, key: key, owner: owner, kind: kindMutex, keys: k}
	var w waiter
	if opts.Fair {
		waitMs := l.waiterTimeout.Milliseconds()
		w = waiter{
			id:        owner,
			ttl:       opts.TTL,
			keepAlive: l.waiterTimeout / 3,
			attempt: func(ctx context.Context, sc goredis.Scripter, queued bool) ([]int64, error) {
				return run(ctx, sc, l.s.fairAcquire, []string{k.lock, k.fence, k.queue, k.deadlines}, owner, ttl, flag(queued), waitMs)
			},
			cleanup: func(ctx context.Context) {
				l.s.release.Run(ctx, l.client, []string{k.lock, k.queue, k.deadlines}, owner, k.channel)
				l.s.dequeue.Run(ctx, l.client, []string{k.queue, k.deadlines, k.lock}, owner, k.channel)
			},
		}
	} else {
		w = waiter{
			ttl: opts.TTL,
			attempt: func(ctx context.Context, sc goredis.Scripter, _ bool) ([]int64, error) {
				return run(ctx, sc, l.s.acquire, []string{k.lock, k.fence}, owner, ttl)
			},
			cleanup: func(ctx context.Context) {
				l.s.release.Run(ctx, l.client, []string{k.lock, k.queue, k.deadlines}, owner, k.channel)
			},
		}
	}
	return l.acquire(ctx, key, k.channel, opts.Wait, lease, w)
}

// check rejects what no attempt should be made with.
func (l *Locker) check(ctx context.Context, opts guard.AcquireOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if l.optErr != nil {
		return l.optErr
	}
	if opts.TTL < time.Millisecond {
		return fmt.Errorf("%w: TTL %v, want at least 1ms", guard.ErrInvalidOption, opts.TTL)
	}
	return nil
}

// run runs a script that answers an array of integers.
func run(ctx context.Context, sc goredis.Scripter, s *goredis.Script, keys []string, args ...any) ([]int64, error) {
	r, err := s.Run(ctx, sc, keys, args...).Int64Slice()
	if err != nil {
		return nil, unavailable(ctx, err)
	}
	return r, nil
}

// unavailable wraps a failed call in guard.ErrUnavailable, except that the
// caller's own cancellation is reported as the context's error.
func unavailable(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %w", guard.ErrUnavailable, err)
}

// newOwner returns a random, unguessable owner id: the proof of ownership
// that every release and refresh presents.
func newOwner() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand documents it)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

package redis

import (
	"context"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
)

type kind int

const (
	kindMutex kind = iota
	kindRead
	kindWrite
	kindPermit
)

// lease is one holding of a lock, a read or write lock or a permit. Its
// owner id is the proof of ownership every release and refresh presents.
type lease struct {
	l     *Locker
	key   string
	owner string
	token uint64
	kind  kind
	keys  keySet

	mu       sync.Mutex // serializes Release, so released is decided once
	released bool
}

// Key returns the key the lease was acquired for.
func (ls *lease) Key() string { return ls.key }

// Token returns the lease's fencing token, from the key's counter in Redis.
func (ls *lease) Token() uint64 { return ls.token }

// Done returns nil: Redis does not tell a holder that its key expired, so a
// loss is learnt through Refresh.
func (ls *lease) Done() <-chan struct{} { return nil }

// Refresh extends the lease to ttl from now, counted by Redis.
func (ls *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: TTL %v, want at least 1ms", guard.ErrInvalidOption, ttl)
	}
	ls.mu.Lock()
	released := ls.released
	ls.mu.Unlock()
	if released {
		return fmt.Errorf("%w: %q was released", guard.ErrNotHeld, ls.key)
	}
	s, keys, args := ls.refreshCall(ttl)
	n, err := s.Run(ctx, ls.l.client, keys, args...).Int64()
	return ls.refreshResult(ctx, n, err)
}

func (ls *lease) refreshCall(ttl time.Duration) (*goredis.Script, []string, []any) {
	ms := ttl.Milliseconds()
	sc := ls.l.s
	switch ls.kind {
	case kindRead:
		return sc.zrefresh, []string{ls.keys.readers}, []any{ls.owner, ms}
	case kindWrite:
		return sc.refresh, []string{ls.keys.writer}, []any{ls.owner, ms}
	case kindPermit:
		return sc.zrefresh, []string{ls.keys.permits}, []any{ls.owner, ms}
	default:
		return sc.refresh, []string{ls.keys.lock}, []any{ls.owner, ms}
	}
}

func (ls *lease) refreshResult(ctx context.Context, n int64, err error) error {
	if err != nil {
		return unavailable(ctx, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %q expired or was taken over", guard.ErrNotHeld, ls.key)
	}
	return nil
}

// Release gives the lease up, only if it is still this owner's.
func (ls *lease) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.released {
		return nil
	}
	n, err := ls.releaseOn(ctx, ls.l.client)
	if err != nil {
		return unavailable(ctx, err)
	}
	ls.released = true
	if n == 0 {
		return fmt.Errorf("%w: %q expired or was taken over before release", guard.ErrNotHeld, ls.key)
	}
	return nil
}

// releaseOn runs the owner-checked release script: one round trip that
// deletes the lease and publishes on the key's channel.
func (ls *lease) releaseOn(ctx context.Context, sc goredis.Scripter) (int64, error) {
	s := ls.l.s
	k := ls.keys
	switch ls.kind {
	case kindRead:
		return s.zrelease.Run(ctx, sc, []string{k.readers}, ls.owner, k.channel, "0").Int64()
	case kindWrite:
		return s.writeRelease.Run(ctx, sc, []string{k.writer}, ls.owner, k.channel).Int64()
	case kindPermit:
		return s.zrelease.Run(ctx, sc, []string{k.permits}, ls.owner, k.channel, "1").Int64()
	default:
		return s.release.Run(ctx, sc, []string{k.lock, k.queue, k.deadlines}, ls.owner, k.channel).Int64()
	}
}

// RefreshBatch refreshes leases acquired from this Locker in one pipelined
// round trip (one per node on a Cluster). A lease from another Locker gets
// an error wrapping guard.ErrInvalidOption.
func (l *Locker) RefreshBatch(ctx context.Context, leases []guard.Lease, ttl time.Duration) []error {
	errs := make([]error, len(leases))
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if ttl < time.Millisecond {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: TTL %v, want at least 1ms", guard.ErrInvalidOption, ttl)
		}
		return errs
	}
	mine := make([]*lease, len(leases))
	for i, g := range leases {
		ls, ok := g.(*lease)
		switch {
		case !ok || ls.l != l:
			errs[i] = fmt.Errorf("%w: lease of key %q is not from this Locker", guard.ErrInvalidOption, g.Key())
		default:
			ls.mu.Lock()
			if ls.released {
				errs[i] = fmt.Errorf("%w: %q was released", guard.ErrNotHeld, ls.key)
			} else {
				mine[i] = ls
			}
			ls.mu.Unlock()
		}
	}
	cmds := make([]*goredis.Cmd, len(leases))
	send := func(useEval bool) (noScript bool) {
		pipe := l.client.Pipeline()
		for i, ls := range mine {
			if ls == nil {
				continue
			}
			s, keys, args := ls.refreshCall(ttl)
			if useEval {
				cmds[i] = s.Eval(ctx, pipe, keys, args...)
			} else {
				cmds[i] = s.EvalSha(ctx, pipe, keys, args...)
			}
		}
		// Each command's own error is read below.
		_, _ = pipe.Exec(ctx)
		for _, c := range cmds {
			if c != nil && goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				return true
			}
		}
		return false
	}
	if send(false) {
		// The server lost its script cache (restart, SCRIPT FLUSH): send
		// the bodies once; the single-lease calls reload the cache.
		send(true)
	}
	for i, ls := range mine {
		if ls != nil {
			n, err := cmds[i].Int64()
			errs[i] = ls.refreshResult(ctx, n, err)
		}
	}
	return errs
}

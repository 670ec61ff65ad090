package redlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
)

// lease is one holding of a RedLock: the owner's votes on a majority.
type lease struct {
	l              *Locker
	key, owner     string
	lock, fenceKey string
	token          uint64

	mu       sync.Mutex
	released bool
}

// Key returns the key the lease was acquired for.
func (ls *lease) Key() string { return ls.key }

// Token returns the fencing token: one above the highest counter of the
// majority that granted the lease.
func (ls *lease) Token() uint64 { return ls.token }

// Done returns nil: the nodes do not tell a holder its votes expired.
func (ls *lease) Done() <-chan struct{} { return nil }

// Refresh extends the owner's votes on every node still holding them, and
// succeeds only when a majority extended within the TTL's validity.
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
	l := ls.l
	start := time.Now()
	rs := l.each(ctx, func(ctx context.Context, n goredis.UniversalClient) (any, error) {
		return l.refresh.Run(ctx, n, []string{ls.lock}, ls.owner, ttl.Milliseconds()).Int64()
	})
	held, failed := count(rs)
	if held >= l.quorum && l.validity(ttl, start) > 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if failed > 0 && held+failed >= l.quorum {
		return fmt.Errorf("%w: %q: refreshed on %d of %d nodes, %d failed: %w", guard.ErrUnavailable, ls.key, held, len(l.nodes), failed, firstErr(rs))
	}
	return fmt.Errorf("%w: %q: held on %d of %d nodes, no majority", guard.ErrNotHeld, ls.key, held, len(l.nodes))
}

// Release withdraws the owner's votes from every node.
func (ls *lease) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.released {
		return nil
	}
	l := ls.l
	rs := l.releaseAll(ctx, ls)
	held, failed := count(rs)
	if held < l.quorum && failed > 0 && held+failed >= l.quorum {
		// Not knowing whether a majority still holds the owner's votes,
		// leave the lease releasable; the votes expire with the TTL anyway.
		return fmt.Errorf("%w: %q: released on %d of %d nodes, %d failed: %w", guard.ErrUnavailable, ls.key, held, len(l.nodes), failed, firstErr(rs))
	}
	ls.released = true
	if held < l.quorum {
		return fmt.Errorf("%w: %q: held on %d of %d nodes at release", guard.ErrNotHeld, ls.key, held, len(l.nodes))
	}
	return nil
}

// count tallies the nodes that answered 1 and those that failed.
func count(rs []result) (ok, failed int) {
	for _, r := range rs {
		switch {
		case r.err != nil:
			failed++
		case r.val.(int64) == 1:
			ok++
		}
	}
	return ok, failed
}

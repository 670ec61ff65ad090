package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// lease is one holding of a RedLock: the owner's votes on a majority.
type lease struct {
	l *Locker
	// lock is the key of the votes on the nodes (lockKeyOf).
	lock string
	// lockArg and owner are the key and the owner id as the scripts take
	// them: interface values, converted once for all the lease's rounds.
	lockArg, owner any
	token          uint64
	// day is when the vote's key expires, as the granting nodes set it
	// as a rule, worked out on our clock (expiryDay): a release writes it
	// back, unread, and a node where it differs corrects it.
	day int64
	// votes are the nodes that may hold the owner's vote: those that
	// granted it or did not answer. The others refused it, holding another
	// owner's, so it cannot be there; refreshes and the release skip them.
	votes []int
	// counted are the votes a refresh extends and counts: those of nodes
	// whose server was known at the acquisition (see identify). One
	// unknown may be another node's server under a second address.
	counted []int
	// expiry is Expiry in nanoseconds after epoch: a refresh moves it while
	// guard reads it.
	expiry atomic.Int64
}

// epoch anchors lease expiries on the monotonic clock.
var epoch = time.Now()

func (ls *lease) setExpiry(t time.Time) { ls.expiry.Store(int64(t.Sub(epoch))) }

// lowerExpiry moves the expiry to t when t is sooner.
func (ls *lease) lowerExpiry(t time.Time) {
	at := int64(t.Sub(epoch))
	for {
		cur := ls.expiry.Load()
		if at >= cur || ls.expiry.CompareAndSwap(cur, at) {
			return
		}
	}
}

// Token implements driver.Lease: one above the highest counter of the
// majority that granted the lease.
func (ls *lease) Token() uint64 { return ls.token }

// Expiry implements driver.Lease: the start of the round that granted or
// last extended the votes on a majority, plus the TTL, less the drift
// allowance.
func (ls *lease) Expiry() time.Time { return epoch.Add(time.Duration(ls.expiry.Load())) }

// Refresh implements driver.Lease: it extends the owner's votes on the nodes
// that may hold them and whose server was known at the acquisition, and
// succeeds only when a majority extended them before the new expiry. One
// that fails leaves Expiry where it was, or lowers it to the refresh's start
// plus ttl less the drift allowance when that is sooner: the nodes it
// reached lapse then.
//
// It fails with ErrNotHeld once the nodes' identities, read again, show two
// of them to be one server (a failover behind an address, onto another
// node's server): the lease's majority may have counted that server twice,
// and renewing it would keep it so for as long as it lived. A refresh
// reads them itself only once those read last are identityReuse old, not
// every second while a node's is unknown as an acquisition does: a node
// that does not answer would hold every refresh for the node timeout.
func (ls *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	l := ls.l
	ids := l.ids.Load()
	if ids == nil || time.Since(ids.read) >= identityReuse {
		var err error
		if ids, err = l.identify(ctx); err != nil && !errors.Is(err, driver.ErrInvalidOption) {
			return err
		}
	}
	if ids.err != nil {
		return fmt.Errorf("%w: %w", driver.ErrNotHeld, ids.err)
	}
	start := time.Now()
	cmd := []any{"evalsha", l.refreshSha, 1, ls.lockArg, ls.owner, ttl.Milliseconds(), ls.token}
	rs := l.gather(ctx, func(ctx context.Context, i int) (any, error) {
		return evalsha(ctx, l.nodes[i], refreshSrc, cmd).Int64()
	}, ones, ls.counted, nil)
	held, failed := count(rs)
	expiry := l.expiry(ttl, start)
	if held >= l.quorum && time.Now().Before(expiry) {
		ls.setExpiry(expiry)
		return nil
	}
	// A refresh that failed may still have reached some nodes, and set
	// their votes to lapse at ttl from there: sooner than the lease's
	// Expiry says, when ttl is shorter than what the lease had left.
	ls.lowerExpiry(expiry)
	if err := ctx.Err(); err != nil {
		return err
	}
	if failed > 0 && held+failed >= l.quorum {
		return fmt.Errorf("%w: refreshed on %d of %d nodes, %d failed: %w", driver.ErrUnavailable, held, len(l.nodes), failed, firstErr(rs))
	}
	return fmt.Errorf("%w: held on %d of %d nodes, no majority", driver.ErrNotHeld, held, len(l.nodes))
}

// Release implements driver.Lease: it withdraws the owner's votes from the
// nodes that may hold them. It returns once a majority has withdrawn them,
// when the lock is free to take; the other nodes' withdrawals finish in the
// background (within the node timeout). They cannot touch a later lease's
// votes: every attempt has an owner id of its own. When ctx is done first,
// it returns at once, reporting the backend unavailable, and the
// withdrawals still finish in the background.
func (ls *lease) Release(ctx context.Context) error {
	l := ls.l
	rs := l.withdraw(ctx, ls.lockArg, ls.owner, ls.token, ls.day, ls.votes, ones)
	held, failed := count(rs)
	if held < l.quorum && failed > 0 && held+failed >= l.quorum {
		// Whether a majority still holds the owner's votes is unknown; they
		// expire with the TTL.
		return fmt.Errorf("%w: released on %d of %d nodes, %d failed: %w", driver.ErrUnavailable, held, len(l.nodes), failed, firstErr(rs))
	}
	if held < l.quorum {
		return fmt.Errorf("%w: held on %d of %d nodes at release", driver.ErrNotHeld, held, len(l.nodes))
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

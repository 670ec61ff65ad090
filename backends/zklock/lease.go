package zklock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// lease is a contender node that holds its lock. It is a
// driver.SessionLease: the session keeps the node, and guard watches the
// session (its epoch), not the lease. It is also a driver.RevocableLease: a
// data watch on its node, set watchDelay after a lock's grant (at once
// after a permit's, or a grant that had to read the node), tells the
// Locker's event callback when someone else deletes the node.
type lease struct {
	l     *Locker
	node  string
	token uint64
	ep    *epoch // guarded by Locker.mu until the grant returns the lease
	// guarded by Locker.mu
	revoke  func()    // OnRevoke's f, until it is called or forgotten
	revoked bool      // the node was deleted by someone else while the lease was live
	watchAt time.Time // when its delayed watch is due (see watchAfter); zero when none waits
	// released: Release has taken the lease off its epoch's held count.
	released bool
}

var _ driver.RevocableLease = (*lease)(nil)

// Token implements driver.Lease: the node's czxid.
func (le *lease) Token() uint64 { return le.token }

// Expiry implements driver.Lease: the session's.
func (le *lease) Expiry() time.Time { return le.ep.Expiry() }

// Session implements driver.SessionLease.
func (le *lease) Session() driver.Session { return le.ep }

func (le *lease) lost() bool {
	select {
	case <-le.ep.done:
		return true
	default:
		return false
	}
}

// Refresh extends nothing, since the session keeps the node alive, and guard
// never calls it for a session lease. For whoever does, it checks with one
// request that the node is still there, owned by the session the lease was
// granted on, and that the lease was not declared lost. ttl is not used.
func (le *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if le.lost() {
		return fmt.Errorf("%w: zookeeper session lost", driver.ErrNotHeld)
	}
	e, err := call(ctx, le.l, "refresh", func() (existence, error) {
		ok, stat, err := le.l.conn.Exists(le.node)
		return existence{ok: ok, stat: stat}, err
	})
	if err != nil {
		return err
	}
	if !e.ok || e.stat.EphemeralOwner != le.ep.session || le.lost() {
		return fmt.Errorf("%w: node gone", driver.ErrNotHeld)
	}
	return nil
}

// OnRevoke implements driver.RevocableLease. A lease the Locker no longer
// tracks (released, or its epoch lost) forgets f.
func (le *lease) OnRevoke(f func()) {
	l := le.l
	l.mu.Lock()
	if l.leases[le.node] != le {
		l.mu.Unlock()
		return
	}
	if !le.revoked {
		le.revoke = f
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	f()
}

// Release deletes the lease's node (its name is unique to this lease, so no
// other owner's node can be touched). It returns ErrNotHeld when the node was
// already gone or the lease had been declared lost before. When the delete
// gets no answer, a background retry deletes the node once the connection is
// back, and the session's expiry removes it if it never is: the lock does not
// stay taken past the session timeout. After the Locker's Close, which ended
// the session and so deleted the node, it sends nothing and returns
// ErrNotHeld at once.
func (le *lease) Release(ctx context.Context) error {
	// Forgotten before the delete, whose watch event is no revocation.
	le.l.untrack(le)
	if le.l.isClosed() {
		le.l.dropHeld(le)
		return fmt.Errorf("%w: the Locker was closed before release", driver.ErrNotHeld)
	}
	_, err := call(ctx, le.l, "release", func() (struct{}, error) {
		return struct{}{}, le.l.conn.Delete(le.node, -1)
	})
	le.l.dropHeld(le)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		le.l.removeLater(le.node, nil)
		return err
	}
	if err != nil || le.lost() {
		return fmt.Errorf("%w: node gone or session lost before release", driver.ErrNotHeld)
	}
	return nil
}

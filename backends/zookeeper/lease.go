package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard"
)

// lease is a contender node that holds its lock.
type lease struct {
	l     *Locker
	key   string
	node  string
	token uint64
	ep    *epoch

	mu       sync.Mutex // serializes Release
	released bool
}

func (le *lease) Key() string   { return le.key }
func (le *lease) Token() uint64 { return le.token }

// Done is closed when the Locker declares the lease lost (see the package
// documentation for the rule) or is closed.
func (le *lease) Done() <-chan struct{} { return le.ep.done }

func (le *lease) lost() bool {
	select {
	case <-le.ep.done:
		return true
	default:
		return false
	}
}

// Refresh does not extend anything, since the session keeps the node alive:
// it checks with one request that the node is still there, owned by the
// session the lease was granted on, and that the lease was not declared lost.
// ttl is not used.
func (le *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	le.mu.Lock()
	released := le.released
	le.mu.Unlock()
	if released || le.lost() {
		return fmt.Errorf("%w: %q", guard.ErrNotHeld, le.key)
	}
	e, err := call(ctx, le.l, "refresh", func() (existence, error) {
		ok, stat, err := le.l.conn.Exists(le.node)
		return existence{ok: ok, stat: stat}, err
	})
	if err != nil {
		return err
	}
	if !e.ok || e.stat.EphemeralOwner != le.ep.session || le.lost() {
		return fmt.Errorf("%w: %q", guard.ErrNotHeld, le.key)
	}
	return nil
}

// Release deletes the lease's node (its name is unique to this lease, so no
// other owner's node can be touched). It returns ErrNotHeld when the node was
// already gone or the lease had been declared lost before, even though the
// node is cleaned up then too.
func (le *lease) Release(ctx context.Context) error {
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.released {
		return nil
	}
	_, err := call(ctx, le.l, "release", func() (struct{}, error) {
		return struct{}{}, le.l.conn.Delete(le.node, -1)
	})
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	le.released = true
	le.l.dropHeld(le.ep)
	if err != nil || le.lost() {
		return fmt.Errorf("%w: %q", guard.ErrNotHeld, le.key)
	}
	return nil
}

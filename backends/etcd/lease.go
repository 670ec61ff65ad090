package etcd

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard"
)

// lease is one holding: a key on a session's etcd lease.
type lease struct {
	locker *Locker
	s      *session
	name   string
	own    string
	rev    int64

	mu       sync.Mutex
	released bool
}

func (le *lease) Key() string { return le.name }

// Token is the key's create revision: etcd's revision counter only grows, so
// every later holder of the lock has a greater one.
func (le *lease) Token() uint64 { return uint64(le.rev) }

// Done is closed when the session the lease belongs to is lost.
func (le *lease) Done() <-chan struct{} { return le.s.done }

// Refresh checks that the lease still holds the lock. The session's
// keepalive, not Refresh, extends the etcd lease (every TTL/3, for all locks
// at once), so ttl must be the TTL the lock was acquired with. The check is
// one read: the key exists with this lease's create revision only while the
// etcd lease is alive on the server.
func (le *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := le.checkRefresh(ttl); err != nil {
		return err
	}
	resp, err := le.locker.client.Get(ctx, le.own, clientv3.WithKeysOnly())
	if err != nil {
		return unavailable(ctx, err)
	}
	return le.verify(resp)
}

// checkRefresh is what Refresh can tell without asking the server.
func (le *lease) checkRefresh(ttl time.Duration) error {
	if ttl != le.s.ttl {
		return fmt.Errorf("%w: refresh with TTL %v of a lock acquired with %v: an etcd session's TTL cannot change",
			guard.ErrInvalidOption, ttl, le.s.ttl)
	}
	le.mu.Lock()
	released := le.released
	le.mu.Unlock()
	if released {
		return fmt.Errorf("%w: %q was released", guard.ErrNotHeld, le.name)
	}
	if le.s.lost() {
		return fmt.Errorf("%w: %q: etcd session lost", guard.ErrNotHeld, le.name)
	}
	return nil
}

// verify checks a read of the lease's key.
func (le *lease) verify(resp *clientv3.GetResponse) error {
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != le.rev || resp.Kvs[0].Lease != int64(le.s.id) {
		return fmt.Errorf("%w: %q: key gone", guard.ErrNotHeld, le.name)
	}
	return nil
}

// Release deletes the key if it is still this lease's (same create
// revision), so a retried or stale release never deletes a newer holder's
// key.
func (le *lease) Release(ctx context.Context) error {
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.released {
		return nil
	}
	resp, err := le.locker.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(le.own), "=", le.rev)).
		Then(clientv3.OpDelete(le.own)).
		Commit()
	if err != nil {
		return unavailable(ctx, err)
	}
	le.released = true
	if !resp.Succeeded {
		return fmt.Errorf("%w: %q: key gone before release", guard.ErrNotHeld, le.name)
	}
	return nil
}

// maxTxnOps is etcd's default limit on operations in one transaction
// (--max-txn-ops).
const maxTxnOps = 128

// RefreshBatch checks many leases of this Locker in one read transaction per
// 128 leases. Leases of another Locker get an error wrapping
// guard.ErrInvalidOption.
func (l *Locker) RefreshBatch(ctx context.Context, leases []guard.Lease, ttl time.Duration) []error {
	errs := make([]error, len(leases))
	var (
		mine []*lease
		at   []int
	)
	for i, gl := range leases {
		le, ok := gl.(*lease)
		switch {
		case !ok || le.locker != l:
			errs[i] = fmt.Errorf("%w: lease of another locker", guard.ErrInvalidOption)
		default:
			if errs[i] = le.checkRefresh(ttl); errs[i] == nil {
				mine = append(mine, le)
				at = append(at, i)
			}
		}
	}
	for start := 0; start < len(mine); start += maxTxnOps {
		batch := mine[start:min(start+maxTxnOps, len(mine))]
		ops := make([]clientv3.Op, len(batch))
		for j, le := range batch {
			ops[j] = clientv3.OpGet(le.own, clientv3.WithKeysOnly())
		}
		resp, err := l.client.Txn(ctx).Then(ops...).Commit()
		for j, le := range batch {
			if err != nil {
				errs[at[start+j]] = unavailable(ctx, err)
				continue
			}
			errs[at[start+j]] = le.verify((*clientv3.GetResponse)(resp.Responses[j].GetResponseRange()))
		}
	}
	return errs
}

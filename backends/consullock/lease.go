package consullock

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// lease is one holding: the lock's key, acquired by a session. It is a
// driver.SessionLease: the session's renewal keeps it, with every other lock
// of the session, alive, so guard sends nothing for it and no goroutine runs
// for it. It is also a driver.RevocableLease, told of a forced release by
// the session's one blocking query on its markers.
type lease struct {
	s     *session
	key   string // the lock key
	token uint64 // the key's ModifyIndex when it was acquired

	// Guarded by s.mu: whether a forced release's marker was seen, and
	// what to call when it is.
	revoked  bool
	onRevoke func()
}

var _ driver.SessionLease = (*lease)(nil)

// Token is the lock key's ModifyIndex as of the acquisition: a Raft index,
// which only grows, across the whole datacenter and across leader changes,
// so every later holder of the lock has a greater one.
func (le *lease) Token() uint64 { return le.token }

// Expiry is the session's.
func (le *lease) Expiry() time.Time { return le.s.Expiry() }

// Session implements driver.SessionLease.
func (le *lease) Session() driver.Session { return le.s }

// Refresh extends nothing: the session's renewal, not Refresh, keeps the
// lock (every TTL/3, for all of the session's locks at once), and guard
// never calls it for a session lease. For whoever does, it checks with one
// read that the lease still holds the lock. ttl must be the TTL the lock
// was acquired with, since a session's TTL cannot change.
func (le *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl != le.s.ttl {
		return fmt.Errorf("%w: refresh with TTL %v of a lock acquired with %v: a consul session's TTL cannot change",
			driver.ErrInvalidOption, ttl, le.s.ttl)
	}
	if le.s.lost() {
		return fmt.Errorf("%w: consul session lost", driver.ErrNotHeld)
	}
	l := le.s.l
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	kv, _, err := l.client.KV().Get(le.key, queryOpts(rctx))
	if err != nil {
		return l.fail(ctx, rctx, err)
	}
	if kv == nil || kv.Session != le.s.id || kv.ModifyIndex != le.token {
		return fmt.Errorf("%w: key gone", driver.ErrNotHeld)
	}
	return nil
}

// Release deletes the lock key if it is still this lease's (the same
// ModifyIndex), so a stale or retried release never deletes a newer
// holder's key.
//
// A lease whose session has ended (lost, given up, or closed with the
// Locker) is not sent anything: its key went, or goes, with the session.
// Release then returns ErrNotHeld at once. When the delete gets no answer,
// the key may still be there and the session's renewal would keep it, and
// the lock, forever: the session is given up instead (destroyed, with
// every key it holds; its other locks are lost with it).
func (le *lease) Release(ctx context.Context) error {
	le.s.forget(le)
	if le.s.lost() {
		return fmt.Errorf("%w: consul session lost before release", driver.ErrNotHeld)
	}
	l := le.s.l
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	ok, _, _, err := l.client.KV().Txn(release(le.key, le.token), queryOpts(rctx))
	if err != nil {
		le.s.giveUp()
		return l.fail(ctx, rctx, err)
	}
	if !ok {
		return fmt.Errorf("%w: key gone before release", driver.ErrNotHeld)
	}
	return nil
}

// release is the transaction that deletes lockKey if its ModifyIndex is
// still token. Not delete-cas: Consul reports a delete-cas of a key that is
// gone as a success, which would hide a lease lost to a forced release.
func release(lockKey string, token uint64) api.KVTxnOps {
	return api.KVTxnOps{
		{Verb: api.KVCheckIndex, Key: lockKey, Index: token},
		{Verb: api.KVDelete, Key: lockKey},
	}
}

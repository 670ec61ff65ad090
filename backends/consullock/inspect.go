package consullock

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

var (
	_ driver.Inspector     = (*Locker)(nil)
	_ driver.Lister        = (*Locker)(nil)
	_ driver.ForceReleaser = (*Locker)(nil)
)

// Inspect implements driver.Inspector with one consistent read of the lock
// key and its queue. The holder is the lock key's session, labelled by the
// key's value; Waiters counts the fair waiters queued under the key (a
// waiter that did not ask for fairness waits on a blocking query and is not
// counted). The holding is SessionBound, with TTL 0: it lives as long as
// the session that keeps it.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	lk := LockKey(key)
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	// The lock key is a prefix of its queue's keys (and of no other lock's
	// key but those of names that start with this one's escape + ".lock").
	pairs, _, err := l.client.KV().List(lk, queryOpts(rctx))
	if err != nil {
		return driver.Inspection{}, l.fail(ctx, rctx, err)
	}
	var in driver.Inspection
	for _, kv := range pairs {
		switch {
		case kv.Key == lk:
			in.Holders = holding(kv)
		case strings.HasPrefix(kv.Key, queueDir(lk)):
			in.Waiters++
		}
	}
	return in, nil
}

// holding reports the holder of a lock key, if it has one. The key's value
// is the label its holder acquired with (AcquireOptions.Owner), verbatim.
func holding(kv *api.KVPair) []driver.Holding {
	if kv == nil || kv.Session == "" {
		return nil
	}
	return []driver.Holding{{Owner: string(kv.Value), Token: kv.ModifyIndex, SessionBound: true}}
}

// List implements driver.Lister.
//
// Lock keys are stored under their path-escaped names followed by ".lock",
// whose order is not the names' (an escape sorts apart from the byte it
// stands for), so Consul cannot start a page at a name. Each call therefore
// reads every key under the escaped prefix, in one consistent read, and
// keeps the limit smallest held names after after: its cost grows with the
// number of keys under prefix, not with limit.
func (l *Locker) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: list limit %d", driver.ErrInvalidOption, limit)
	}
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	pairs, _, err := l.client.KV().List(url.PathEscape(prefix), queryOpts(rctx))
	if err != nil {
		return nil, l.fail(ctx, rctx, err)
	}
	byKey := map[string]*driver.Listed{}
	var out []driver.Listed
	for _, kv := range pairs {
		name, ok := lockName(kv.Key)
		if !ok || name <= after || !strings.HasPrefix(name, prefix) {
			continue
		}
		if hs := holding(kv); hs != nil {
			out = append(out, driver.Listed{Key: name, Inspection: driver.Inspection{Holders: hs}})
		}
	}
	slices.SortFunc(out, func(a, b driver.Listed) int { return strings.Compare(a.Key, b.Key) })
	out = out[:min(limit, len(out))]
	for i := range out {
		byKey[LockKey(out[i].Key)] = &out[i]
	}
	for _, kv := range pairs {
		lk, _, ok := strings.Cut(kv.Key, "/")
		if ok && byKey[lk] != nil && strings.HasSuffix(lk, ".lock") {
			byKey[lk].Waiters++
		}
	}
	return out, nil
}

// lockName is the lock name whose key is k, if k is one: the canonical
// escape of a name followed by ".lock".
func lockName(k string) (string, bool) {
	escaped, ok := strings.CutSuffix(k, ".lock")
	if !ok || strings.Contains(escaped, "/") {
		return "", false
	}
	name, err := url.PathUnescape(escaped)
	if err != nil || url.PathEscape(name) != escaped {
		return "", false
	}
	return name, true
}

// ForceRelease implements driver.ForceReleaser. A holding's token is the
// lock key's ModifyIndex, which changes with every acquisition: the
// holding target names is deleted in one transaction that checks that index
// (the label, the key's value, cannot change without the index),
// so a holding that left after the read, and any later one, is never
// touched; when the transaction fails, the key is read again and judged
// anew. The next holder acquires the key at a later Raft index, so its
// token is greater than every token issued before.
//
// The same transaction acquires a marker under RevokedPrefix by the
// holder's own session, which that session watches with one blocking query:
// its lease, a driver.RevocableLease, reports the revocation (guard then
// cancels the holder's section) as soon as the query returns. Destroying
// the holder's session instead would also take every other lock that
// session holds, so ForceRelease does not.
func (l *Locker) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	lk := LockKey(key)
	for {
		rctx, cancel := l.rctx(ctx)
		kv, _, err := l.client.KV().Get(lk, queryOpts(rctx))
		err = l.fail(ctx, rctx, err)
		cancel()
		if err != nil {
			return nil, err
		}
		hs := holding(kv)
		if hs == nil {
			return nil, nil
		}
		if !target.AnyHolder && !target.Matches(hs[0]) {
			return nil, driver.HolderChanged(hs)
		}
		rctx, cancel = l.rctx(ctx)
		ops := append(release(lk, kv.ModifyIndex),
			&api.KVTxnOp{Verb: api.KVLock, Key: marker(kv.Session, lk, kv.ModifyIndex), Session: kv.Session})
		ok, _, _, err := l.client.KV().Txn(ops, queryOpts(rctx))
		err = l.fail(ctx, rctx, err)
		cancel()
		if err != nil {
			return nil, err
		}
		if ok {
			return hs, nil
		}
	}
}

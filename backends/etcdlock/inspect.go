package etcdlock

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

var (
	_ driver.Inspector     = (*Locker)(nil)
	_ driver.Lister        = (*Locker)(nil)
	_ driver.ForceReleaser = (*Locker)(nil)
)

// Inspect implements driver.Inspector with one read of the lock's
// contender keys. The holders are the contenders the lock admits, as a
// contender would judge them: the oldest key when it is a writer's, or else
// every reader older than the first writer. Waiters counts the others,
// which do queue on the server. Each holding is SessionBound, with TTL 0:
// it lives as long as the session that keeps it, not to a time of its own.
//
// A semaphore named like a lock shares its keys and cannot be told from
// it, since a key does not record its permits: Inspect reports such a
// semaphore's oldest permit only.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	kvs, err := l.contenders(ctx, key)
	if err != nil {
		return driver.Inspection{}, err
	}
	holders, waiters := admitted(KeyDir(key), kvs)
	return driver.Inspection{Holders: holdings(holders), Waiters: waiters}, nil
}

// contenders reads key's contender keys, oldest first.
func (l *Locker) contenders(ctx context.Context, key string) ([]*mvccpb.KeyValue, error) {
	var resp *clientv3.GetResponse
	err := l.members.do(ctx, l.timeout, false, func(rctx context.Context, c *clientv3.Client) error {
		var err error
		resp, err = c.Get(rctx, KeyDir(key), clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Kvs, nil
}

// admitted splits the contender keys of the lock whose directory is dir,
// oldest first, into its holders and the number of its waiters, by the rule
// acquire applies: a writer holds when no key is older, a reader when no
// writer's is.
func admitted(dir string, kvs []*mvccpb.KeyValue) ([]*mvccpb.KeyValue, int) {
	n := 0
	for i, kv := range kvs {
		if !strings.HasPrefix(string(kv.Key[len(dir):]), "r/") {
			if i == 0 {
				n = 1
			}
			break
		}
		n = i + 1
	}
	return kvs[:n], len(kvs) - n
}

// holdings reports holder keys. A contender key's value is the label its
// holder acquired with (AcquireOptions.Owner), verbatim: keys are told apart
// by their names and create revisions, so the value is free to carry it, and
// the empty value of a key put without one reads as no label.
func holdings(kvs []*mvccpb.KeyValue) []driver.Holding {
	if len(kvs) == 0 {
		return nil
	}
	hs := make([]driver.Holding, len(kvs))
	for i, kv := range kvs {
		hs[i] = driver.Holding{Owner: string(kv.Value), Token: uint64(kv.CreateRevision), SessionBound: true}
	}
	return hs
}

// listPage is how many keys one request of List reads, to keep each answer
// well under the message size limits of etcd and gRPC.
const listPage = 512

// List implements driver.Lister.
//
// Lock directories are stored under their path-escaped names followed by
// ".lock/", whose order is not the keys' (the escape of a byte and the
// suffix both sort apart from the bytes they stand for), so etcd cannot
// start a page at a key. Each call therefore reads every contender key
// under the escaped prefix, in pages of listPage at one revision (a
// consistent snapshot; a compaction in between fails the call), and keeps
// the limit smallest held keys after after: its cost grows with the number
// of contenders under prefix, not with limit. An empty prefix reads the
// whole keyspace, skipping keys that are not lock directories.
func (l *Locker) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: list limit %d", driver.ErrInvalidOption, limit)
	}
	from := url.PathEscape(prefix)
	end := clientv3.GetPrefixRangeEnd(from)
	if from == "" {
		from = "\x00" // with end "\x00": every key
	}
	var (
		out   []driver.Listed
		dir   string // the lock directory being gathered
		group []*mvccpb.KeyValue
		rev   int64
	)
	flush := func() {
		if name, ok := lockName(dir); ok && name > after && strings.HasPrefix(name, prefix) {
			slices.SortFunc(group, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
			holders, waiters := admitted(dir, group)
			out = append(out, driver.Listed{Key: name, Inspection: driver.Inspection{Holders: holdings(holders), Waiters: waiters}})
			if len(out) >= 2*limit {
				out = smallest(out, limit)
			}
		}
		group = group[:0]
	}
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		var resp *clientv3.GetResponse
		err := l.members.do(ctx, l.timeout, false, func(rctx context.Context, c *clientv3.Client) error {
			var err error
			resp, err = c.Get(rctx, from, opts...)
			return err
		})
		if err != nil {
			return nil, err
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			d, _, _ := strings.Cut(string(kv.Key), "/")
			if d = d + "/"; d != dir {
				flush()
				dir = d
			}
			group = append(group, kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	flush()
	return smallest(out, limit), nil
}

// lockName is the lock key whose directory is dir, if dir is one: the
// canonical escape of a key followed by ".lock/".
func lockName(dir string) (string, bool) {
	escaped, ok := strings.CutSuffix(dir, ".lock/")
	if !ok || strings.Contains(escaped, "/") {
		return "", false
	}
	name, err := url.PathUnescape(escaped)
	if err != nil || url.PathEscape(name) != escaped {
		return "", false
	}
	return name, true
}

// smallest keeps the n entries of ls with the smallest keys, in key order.
func smallest(ls []driver.Listed, n int) []driver.Listed {
	slices.SortFunc(ls, func(a, b driver.Listed) int { return strings.Compare(a.Key, b.Key) })
	return ls[:min(n, len(ls))]
}

// ForceRelease implements driver.ForceReleaser. A holding's token is its
// contender key's create revision, which no other key shares: the holding
// target names is deleted in one transaction that compares that key's
// create revision (and its value, the label, when target has one), so a
// holding that left after the read, and any key created later, is never
// touched; when the compare fails, the contenders are read again, to name
// who holds the lock instead. A holder stays one until its key goes (only
// older keys could stand before it), so the key read as a holder is still
// one when the transaction runs. With target.AnyHolder, every holder read
// is deleted, in one transaction that checks they are still the keys read
// (it then reads again). The next holder's key is created after the
// deletion, so its create revision, the token, is greater than every token
// issued before.
//
// The same transaction leaves a marker for each holder removed under
// RevokedPrefix, on the holder's own etcd lease, which the holder's session
// watches: its lease, a driver.RevocableLease, reports the revocation
// (guard then cancels the holder's section) as soon as the watch delivers
// it, and the session deletes the marker. ForceRelease does not wait for
// that. A holder whose watch is on a frozen member hears of it only when the
// watch is served again, or not at all if its session ends first; fenced
// storage is what refuses its writes meanwhile. Revoking the holder
// session's etcd lease instead would also take every other lock that
// session holds (all the holder process's locks of that TTL), so
// ForceRelease does not.
//
// Its errors never match driver.ErrNotSent: clientv3 waits for a member
// until ctx ends, and its failures (unavailable, a deadline) do not say
// whether a member got the transaction. Inspect tells whether the holding
// is gone.
func (l *Locker) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	for {
		kvs, err := l.contenders(ctx, key)
		if err != nil {
			return nil, err
		}
		holders, _ := admitted(KeyDir(key), kvs)
		if len(holders) == 0 {
			return nil, nil
		}
		hs := holdings(holders)
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		var removed []driver.Holding
		for i, kv := range holders {
			if !target.AnyHolder && !target.Matches(hs[i]) {
				continue
			}
			k := string(kv.Key)
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", kv.CreateRevision))
			if target.Owner != "" && !target.AnyHolder {
				cmps = append(cmps, clientv3.Compare(clientv3.Value(k), "=", target.Owner))
			}
			ops = append(ops, clientv3.OpDelete(k))
			if kv.Lease != 0 {
				// The compare proves the lease alive: a lease's keys go
				// in the same step as the lease.
				ops = append(ops, clientv3.OpPut(revokedDir(clientv3.LeaseID(kv.Lease))+k, "",
					clientv3.WithLease(clientv3.LeaseID(kv.Lease))))
			}
			removed = append(removed, hs[i])
		}
		if len(removed) == 0 {
			return nil, driver.HolderChanged(hs)
		}
		var resp *clientv3.TxnResponse
		err = l.members.do(ctx, l.timeout, false, func(rctx context.Context, c *clientv3.Client) error {
			var err error
			resp, err = c.Txn(rctx).If(cmps...).Then(ops...).Commit()
			return err
		})
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			return removed, nil
		}
		// A holding read has gone meanwhile: judge again from a new read.
	}
}

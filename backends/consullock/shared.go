package consullock

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

var (
	_ driver.RWLocker   = (*Locker)(nil)
	_ driver.Semaphorer = (*Locker)(nil)
)

// kind is what a shared lock's contender key stands for.
type kind uint64

const (
	// writer: blocked by every earlier key of its read/write lock.
	writer kind = iota + 1
	// reader: blocked by every earlier key but readers'. A key of
	// another kind than these three (its Flags written over, as consul kv
	// put sets them to 0) blocks it too: it may be a writer's.
	reader
	// permit: a semaphore permit, held while fewer than permits keys are
	// earlier.
	permit
)

// contender reads what a contender key stands for from its Flags: its kind
// in the low byte, and a permit's number of permits above it, so that
// Inspect can judge a semaphore without being told.
func contender(kv *api.KVPair) (kind, int) {
	return kind(kv.Flags & 0xff), int(kv.Flags >> 8)
}

// maxPermits is the most permits the 56 bits of Flags above the kind hold:
// a semaphore of more is refused, since its keys would tell Inspect fewer.
const maxPermits = 1<<56 - 1

// RWDir and SemaphoreDir return the Consul KV directories under which the
// contender keys of the read/write lock, and of the semaphore, named key
// live: each contender acquires a key of its own there, by its session,
// whose Flags say what it stands for and whose value is its label, and the
// contenders are ordered by CreateIndex. They are apart from the lock key
// (LockKey) and from each other: a read/write lock, a semaphore and a lock
// of one name are three locks, which Inspect, List and ForceRelease report
// together under that name.
func RWDir(key string) string        { return url.PathEscape(key) + ".rw/" }
func SemaphoreDir(key string) string { return url.PathEscape(key) + ".sem/" }

// AcquireRead implements driver.RWLocker: it waits only for writers that
// came before it, so readers share the lock, and a reader that comes after
// a waiting writer waits for that writer (writers are not starved).
func (l *Locker) AcquireRead(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	if err := checkName(key); err != nil {
		return nil, err
	}
	return l.retry(ctx, opts, func(a *attempt) (driver.Lease, error) { return a.contend(ctx, RWDir(key), opts.Wait, reader, 0) })
}

// AcquireWrite implements driver.RWLocker: it waits for every reader and
// writer that came before it.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	if err := checkName(key); err != nil {
		return nil, err
	}
	return l.retry(ctx, opts, func(a *attempt) (driver.Lease, error) { return a.contend(ctx, RWDir(key), opts.Wait, writer, 0) })
}

// AcquireSemaphore implements driver.Semaphorer: the permits contenders
// with the lowest CreateIndex hold. Any release may admit any waiter, so
// semaphore waiters all block on the semaphore's whole directory: a release
// wakes every waiter of that semaphore.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, permits int, opts driver.AcquireOptions) (driver.Lease, error) {
	if permits < 1 || uint64(permits) > maxPermits {
		return nil, fmt.Errorf("%w: %d semaphore permits (1 to %d)", driver.ErrInvalidOption, permits, uint64(maxPermits))
	}
	if err := checkName(key); err != nil {
		return nil, err
	}
	return l.retry(ctx, opts, func(a *attempt) (driver.Lease, error) {
		return a.contend(ctx, SemaphoreDir(key), opts.Wait, permit, permits)
	})
}

// contend acquires a contender key of its own under dir, reading dir in the
// same transaction, and waits until nothing earlier blocks it.
func (a *attempt) contend(ctx context.Context, dir string, wait bool, k kind, permits int) (driver.Lease, error) {
	own := dir + a.l.queueName(a.s)
	done := a.s.pending(own)
	defer done()
	tree, err := a.enqueue(ctx, dir, own, uint64(k)|uint64(permits)<<8)
	if err != nil {
		return nil, err
	}
	// A permit blocks on the directory from the index of its last read of
	// it; the first read after the transaction has none.
	var dirIndex uint64
	// The transaction's read leaves out, without a word, the keys the
	// ACL hides from the token, an earlier contender's among them: it
	// may show a blocker, which stands, but a grant is judged again on a
	// read that says so (see list). The reads that follow are such reads.
	checked := false
	for {
		mine, blocker := blocking(dir, own, tree, k, permits)
		if mine == nil {
			return nil, a.abort(ctx, own, errSessionLost)
		}
		if blocker == nil && checked {
			return a.granted(ctx, mine, done)
		}
		checked = true
		if blocker == nil {
			if tree, dirIndex, err = a.contenders(ctx, dir, 0); err != nil {
				return nil, a.abort(ctx, own, err)
			}
			continue
		}
		if !wait {
			return nil, a.abort(ctx, own, driver.ErrNotAcquired)
		}
		if k == permit {
			tree, dirIndex, err = a.contenders(ctx, dir, dirIndex)
		} else if err = a.waitGone(ctx, blocker); err == nil {
			tree, dirIndex, err = a.contenders(ctx, dir, 0)
		}
		if err != nil {
			return nil, a.abort(ctx, own, err)
		}
	}
}

// blocking finds own in tree (a read of its directory dir) and returns it,
// and what it waits for: the latest earlier key not a reader's for a
// reader, the latest earlier key for a writer, a pair with dir's name for
// a permit with permits or more keys before it; nil when nothing blocks
// it. mine is nil when own is not in tree (its session ended).
func blocking(dir, own string, tree []*api.KVPair, k kind, permits int) (mine, blocker *api.KVPair) {
	for _, kv := range tree {
		if kv.Key == own {
			mine = kv
		}
	}
	if mine == nil {
		return nil, nil
	}
	var latest *api.KVPair
	earlier := 0
	for _, kv := range tree {
		if other, _ := contender(kv); kv.CreateIndex >= mine.CreateIndex || (k == reader && other == reader) {
			continue
		}
		earlier++
		if latest == nil || kv.CreateIndex > latest.CreateIndex {
			latest = kv
		}
	}
	switch {
	case k == permit && earlier >= permits:
		return mine, &api.KVPair{Key: dir}
	case k != permit && latest != nil:
		return mine, latest
	}
	return mine, nil
}

// waitGone waits, with blocking queries, until the key of kv is gone. The
// first query blocks at kv's ModifyIndex, which is the index a read of the
// key returns while it stands unchanged, so no read precedes it; a key
// already gone answers it at once, since its deletion came later.
func (a *attempt) waitGone(ctx context.Context, kv *api.KVPair) error {
	key, index := kv.Key, kv.ModifyIndex
	for {
		kv, idx, err := a.get(ctx, key, index)
		if err != nil || kv == nil {
			return err
		}
		index = nextIndex(index, idx)
	}
}

// list reads the keys under dir; see read.
func (a *attempt) list(ctx context.Context, dir string, index uint64) ([]*api.KVPair, uint64, error) {
	return read(ctx, a, index, func(q *api.QueryOptions) ([]*api.KVPair, *api.QueryMeta, error) {
		return a.l.client.KV().List(dir, q)
	})
}

// contenders is list, for the contenders of a read/write lock or a
// semaphore under dir, which are granted on what it reads: it reads with
// the token such reads carry (see readToken), and a read from which the
// ACL left keys out fails with errDenied, since a contender judged on it
// could take for free a lock whose holder's key it was not shown. A lock's
// queue needs no such read: it only orders the waiters, and the lock key's
// transaction checks the key itself.
func (a *attempt) contenders(ctx context.Context, dir string, index uint64) ([]*api.KVPair, uint64, error) {
	var (
		pairs []*api.KVPair
		idx   uint64
	)
	hiddenFrom, err := a.l.whole(ctx, func(secret string) (bool, error) {
		var filtered atomic.Bool
		var err error
		pairs, idx, err = read(ctx, a, index, func(q *api.QueryOptions) ([]*api.KVPair, *api.QueryMeta, error) {
			q.Token = secret
			pairs, meta, err := a.l.client.KV().List(dir, q)
			if meta != nil {
				// Any answer's: the reads are of the same keys.
				filtered.CompareAndSwap(false, meta.ResultsFilteredByACLs)
			}
			return pairs, meta, err
		})
		return filtered.Load(), err
	})
	switch {
	case err != nil:
		return nil, 0, err
	case hiddenFrom != "":
		return nil, 0, withheld(dir, hiddenFrom)
	}
	return pairs, idx, nil
}

package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

// kind is what a contender's key stands for.
type kind int

const (
	// exclusive: a mutex or a writer, blocked by every earlier key.
	exclusive kind = iota
	// shared: a reader, blocked only by earlier exclusive keys.
	shared
	// counting: a semaphore permit, held while fewer than permits keys are
	// earlier.
	counting
)

// errSessionLost ends an attempt whose session was lost or given up before
// it was granted: its key vanished, or will, with the session.
var errSessionLost = fmt.Errorf("%w: etcd session lost", driver.ErrUnavailable)

// attempt is one contender's key and the range of keys that block it.
type attempt struct {
	l       *Locker
	s       *session
	own     string // the contender's etcd key
	from    string // the blocking range is [from, end)
	end     string
	rev     int64  // create revision of own, once put
	label   string // own's value: the holder's label, for Inspect
	permits int64
	kind    kind
	// le is the lease the attempt returns once granted, tracked by the
	// session from before own is put.
	le *lease
}

// acquire is Acquire, AcquireRead, AcquireWrite and AcquireSemaphore. A
// waiting acquisition starts over, with a new key and a session that is
// alive, after every failure to reach etcd, until ctx is done, but not
// after a refusal that would come again (see refusedAgain). One that
// does not wait starts over only when its put was cut short because the
// member it went to stopped answering, or was refused because the session's
// lease was gone (revoked by an operator, before the keepalive noticed), at
// most twice: the attempt put nothing, and the next goes to another member,
// or on a new session.
func (l *Locker) acquire(ctx context.Context, name string, opts driver.AcquireOptions, k kind, permits int) (driver.Lease, error) {
	backoff := driver.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for moved := 0; ; {
		lease, err := l.attempt(ctx, name, opts, k, permits)
		if movesOn(ctx, err, moved, rpctypes.ErrLeaseNotFound) {
			moved++
			continue
		}
		if err == nil || !opts.Wait || !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, errClosed) || refusedAgain(err) {
			return lease, err
		}
		if err := driver.Sleep(ctx, backoff.Next(), nil); err != nil {
			return nil, err
		}
	}
}

// attempt makes one attempt at name, with a key of its own.
func (l *Locker) attempt(ctx context.Context, name string, opts driver.AcquireOptions, k kind, permits int) (driver.Lease, error) {
	s, err := l.session(ctx, opts.TTL)
	if err != nil {
		return nil, err
	}
	d := KeyDir(name)
	a := &attempt{l: l, s: s, from: d, end: clientv3.GetPrefixRangeEnd(d), kind: k, permits: int64(permits), label: opts.Owner}
	dir := d
	if k == shared {
		dir = d + readerDir
		// Writer keys are hex digits and '-', all before "r".
		a.end = d + "r"
	}
	a.le, a.own = s.track(name, dir, k == shared)
	var granted driver.Lease
	if !opts.Wait && k != counting {
		granted, err = a.try(ctx)
	} else {
		granted, err = a.enqueue(ctx, opts.Wait)
	}
	if err != nil {
		s.forget(a.le)
	}
	return granted, err
}

// try puts the key only if nothing blocks it, in one transaction, so that a
// failed attempt writes nothing.
func (a *attempt) try(ctx context.Context) (driver.Lease, error) {
	resp, err := a.put(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(a.from).WithRange(a.end), "=", 0)},
		clientv3.OpPut(a.own, a.label, clientv3.WithLease(a.s.id)))
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, driver.ErrNotAcquired
	}
	a.rev = resp.Header.Revision
	if err := ctx.Err(); err != nil {
		return nil, a.abort(ctx, err)
	}
	return a.lease(ctx)
}

// put commits the transaction that puts own, on a context that ctx's
// cancellation does not reach: a put cancelled in flight could still be
// applied after a delete meant to undo it, and leave a key behind that
// blocks everyone for as long as the session lives. When the outcome stays
// unknown (no answer within the request timeout), the session is given up,
// so that its lease, and any such key, expires. Should ctx end first, put
// returns ctx's error at once and leaves the transaction to finish in the
// background, where a key it put is removed (see unbound).
func (a *attempt) put(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	return unbound(ctx, &a.l.runners, func() (*clientv3.TxnResponse, error) {
		var resp *clientv3.TxnResponse
		err := a.l.members.do(ctx, a.l.timeout, true, func(rctx context.Context, c *clientv3.Client) error {
			var err error
			resp, err = c.Txn(rctx).If(cmps...).Then(ops...).Commit()
			return err
		})
		if err != nil {
			// A put the member refused was not applied, and leaves
			// nothing behind: the session's other locks are kept, unless
			// the refusal says the session's lease is gone.
			if !refused(err) || errors.Is(err, rpctypes.ErrLeaseNotFound) {
				a.s.giveUp()
			}
			return nil, err
		}
		return resp, nil
	}, func(resp *clientv3.TxnResponse) {
		if resp.Succeeded {
			a.remove(ctx)
		}
	})
}

// blockersOp reads what blocks own among the keys created before revision
// below: the latest of them for an ordered lock, up to permits of them for a
// semaphore. (Not a count: etcd ignores the create-revision filter when it
// only counts.)
func (a *attempt) blockersOp(below int64) clientv3.Op {
	opts := []clientv3.OpOption{clientv3.WithRange(a.end)}
	if below > 0 {
		opts = append(opts, clientv3.WithMaxCreateRev(below-1))
	}
	if a.kind == counting {
		opts = append(opts, clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend),
			clientv3.WithLimit(a.permits), clientv3.WithKeysOnly())
	} else {
		opts = append(opts, clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
			clientv3.WithLimit(1), clientv3.WithKeysOnly())
	}
	return clientv3.OpGet(a.from, opts...)
}

// enqueue puts the key and, in the same transaction, reads what was there
// before it; then waits for its turn.
func (a *attempt) enqueue(ctx context.Context, wait bool) (driver.Lease, error) {
	resp, err := a.put(ctx, nil, a.blockersOp(0), clientv3.OpPut(a.own, a.label, clientv3.WithLease(a.s.id)))
	if err != nil {
		return nil, err
	}
	a.rev = resp.Header.Revision
	if err := ctx.Err(); err != nil {
		return nil, a.abort(ctx, err)
	}
	before := resp.Responses[0].GetResponseRange()
	if a.kind == counting {
		if int64(len(before.Kvs)) < a.permits {
			return a.lease(ctx)
		}
		if !wait {
			return nil, a.abort(ctx, driver.ErrNotAcquired)
		}
		err = a.waitCount(ctx)
	} else if len(before.Kvs) > 0 {
		// The predecessor existed when own was put, at revision a.rev.
		err = a.waitPredecessor(ctx, before.Kvs[0], a.rev)
	}
	if err != nil {
		return nil, a.abort(ctx, err)
	}
	return a.lease(ctx)
}

// recheck reads the blockers again, provided own still exists: without it, a
// contender whose session expired would find nothing before it and believe
// it holds the lock.
func (a *attempt) recheck(ctx context.Context) (*clientv3.TxnResponse, error) {
	var resp *clientv3.TxnResponse
	err := a.l.members.repeat(ctx, a.l.timeout, false, func(actx context.Context, c *clientv3.Client) error {
		var err error
		resp, err = c.Txn(actx).
			If(clientv3.Compare(clientv3.CreateRevision(a.own), "=", a.rev)).
			Then(a.blockersOp(a.rev)).
			Commit()
		return err
	})
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, errSessionLost
	}
	return resp, nil
}

// waitPredecessor waits until no key in the blocking range precedes own,
// watching one key at a time: the latest before own.
func (a *attempt) waitPredecessor(ctx context.Context, pred *mvccpb.KeyValue, knownAt int64) error {
	for pred != nil {
		if err := a.waitDeleted(ctx, string(pred.Key), pred.CreateRevision, knownAt); err != nil {
			return err
		}
		// The predecessor may have been a waiter that gave up, with others
		// still before it.
		resp, err := a.recheck(ctx)
		if err != nil {
			return err
		}
		pred, knownAt = nil, resp.Header.Revision
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			pred = kvs[0]
		}
	}
	return nil
}

// waitDeleted returns once key, which existed at revision knownAt with
// create revision created, is deleted.
//
// The watch starts at the server's current revision, which keeps it among the
// server's synced watchers, notified as soon as the deletion is applied; a
// watch from an older revision would be served by the catch-up loop, every
// 100 ms. A deletion between knownAt and the watch's start would be missed,
// so when the revision moved in between, the key is looked up once more; it
// is gone if it was put again since (a session puts its keys again, see
// session.track), since the new one stands after own.
func (a *attempt) waitDeleted(ctx context.Context, key string, created, knownAt int64) error {
	gone := func(ctx context.Context) (bool, error) {
		var kvs []*mvccpb.KeyValue
		err := a.l.members.repeat(ctx, a.l.timeout, false, func(actx context.Context, c *clientv3.Client) error {
			g, err := c.Get(actx, key, clientv3.WithKeysOnly())
			if err == nil {
				kvs = g.Kvs
			}
			return err
		})
		if err != nil {
			return false, err
		}
		return len(kvs) == 0 || kvs[0].CreateRevision != created, nil
	}
	return a.watchDeletes(ctx, key, func(wr clientv3.WatchResponse) (bool, error) {
		if !wr.Created {
			return len(wr.Events) > 0, nil
		}
		if wr.Header.Revision == knownAt {
			return false, nil
		}
		return gone(ctx)
	}, gone)
}

// waitCount waits until fewer than permits keys precede own. Any deletion in
// the range may be the one that lets own in, so every semaphore waiter
// watches the whole range and counts again on each deletion.
func (a *attempt) waitCount(ctx context.Context) error {
	// Counting once the watch exists, and after every deletion from then on,
	// misses none.
	fewer := func(ctx context.Context) (bool, error) {
		resp, err := a.recheck(ctx)
		if err != nil {
			return false, err
		}
		return int64(len(resp.Responses[0].GetResponseRange().Kvs)) < a.permits, nil
	}
	return a.watchDeletes(ctx, a.from, func(clientv3.WatchResponse) (bool, error) { return fewer(ctx) }, fewer, clientv3.WithRange(a.end))
}

// watchDeletes watches deletions of key (a range with WithRange) from the
// server's current revision, and passes the watch's creation and each batch
// of deletions to handle until it reports done, fails, ctx ends or the
// session is lost.
//
// Every third of the session's TTL it also asks check, by a plain request,
// whether the wait is over: a watch stream on a member that froze (a
// stopped process, a stalled disk) neither delivers events nor fails, and
// the waiters queued behind this one would stall with it. A failed check
// is only retried. When the Locker moves its requests to another member,
// the watch moves with them; its creation is handled, and checked, as the
// first one was. The checks, the moves and the session's loss are served
// while a watch is being created too (see startWatch).
func (a *attempt) watchDeletes(ctx context.Context, key string, handle func(clientv3.WatchResponse) (bool, error),
	check func(context.Context) (bool, error), opts ...clientv3.OpOption) error {
	opts = append(opts, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	var (
		cancel  context.CancelFunc
		moved   <-chan struct{}
		created <-chan clientv3.WatchChan // until the watch is created
		wch     clientv3.WatchChan
	)
	watch := func() {
		var wctx context.Context
		wctx, cancel = context.WithCancel(clientv3.WithRequireLeader(ctx))
		moved = a.l.members.changes()
		created, wch = startWatch(wctx, a.l.members.pick().client, key, opts...), nil
	}
	watch()
	defer func() { cancel() }()
	tick := time.NewTicker(a.s.ttl / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.s.done:
			return errSessionLost
		case <-moved:
			cancel()
			watch()
		case wch = <-created:
			created = nil
		case <-tick.C:
			// Bounded by the period: a check sent to the frozen member
			// must not hold up the next one, which may reach another.
			cctx, ccancel := context.WithTimeout(ctx, a.s.ttl/3)
			done, err := check(cctx)
			ccancel()
			if done && err == nil {
				return nil
			}
		case wr, ok := <-wch:
			if !ok {
				return driver.Unavailable(ctx, errors.New("etcd: watch closed"))
			}
			if err := wr.Err(); err != nil {
				return driver.Unavailable(ctx, fmt.Errorf("etcd: %w", err))
			}
			if !wr.Created && len(wr.Events) == 0 {
				continue // progress notification
			}
			if done, err := handle(wr); done || err != nil {
				return err
			}
		}
	}
}

// startWatch creates a watch on c without waiting for it, and delivers its
// channel once created. clientv3's Watch returns only once the member has
// confirmed the watch, or ctx has ended: a member whose process froze
// confirms nothing, and a caller waiting in Watch would serve nothing else
// (its checks, the Locker's move to another member, its session's loss)
// until the member came back. Ending ctx ends the wait.
func startWatch(ctx context.Context, c *clientv3.Client, key string, opts ...clientv3.OpOption) <-chan clientv3.WatchChan {
	created := make(chan clientv3.WatchChan, 1)
	go func() { created <- c.Watch(ctx, key, opts...) }()
	return created
}

// abort removes own, which has been put, and returns cause; once ctx is
// done, the removal goes on in the background (see unbound).
func (a *attempt) abort(ctx context.Context, cause error) error {
	unbound(ctx, &a.l.runners, func() (struct{}, error) {
		a.remove(ctx)
		return struct{}{}, nil
	}, nil)
	return cause
}

// remove deletes own. The key is this attempt's, and no later contender
// puts it again (only a release frees a key for that), so deleting it
// unconditionally, and again after an attempt without answer, cannot touch
// anyone else's. If the delete cannot be confirmed, the key would block
// every later contender for as long as the session lives, so the session
// is given up instead: its lease expires, or is revoked, and takes the key
// with it. A session already lost is past that point, and no delete is
// sent.
func (a *attempt) remove(ctx context.Context) {
	if a.s.lost() {
		return // the lease's revocation, or its expiry, takes the key
	}
	err := a.l.members.repeat(ctx, a.l.timeout, true, func(actx context.Context, c *clientv3.Client) error {
		_, err := c.Delete(actx, a.own)
		return err
	})
	if err != nil {
		a.s.giveUp()
	}
}

// lease returns the lease of a granted attempt, unless its session was lost
// or given up meanwhile: the lease would be lost as soon as it was returned.
// Under the session's lock, a session lost at the same moment either has
// the grant refused here or counts it among the locks it holds (see
// spareHolders).
func (a *attempt) lease(ctx context.Context) (driver.Lease, error) {
	a.s.mu.Lock()
	lost := a.s.lost()
	if !lost {
		a.le.rev = a.rev
	}
	a.s.mu.Unlock()
	if lost {
		return nil, a.abort(ctx, errSessionLost)
	}
	return a.le, nil
}

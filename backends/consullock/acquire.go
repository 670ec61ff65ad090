package consullock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// errSessionLost ends an attempt whose session was lost or given up before
// it was granted: its keys vanished, or will, with the session.
var errSessionLost = fmt.Errorf("%w: consul session lost", driver.ErrUnavailable)

// waitTime is how long a waiter's blocking query may wait on the server;
// the waiter then asks again. It is also about how long a waiter whose
// query went to a server that stopped answering (a frozen leader) sleeps
// before it re-checks (queryBound): short enough for a waiter to take a
// lock freed meanwhile within a second or so of a new leader serving, at
// the cost of one request a second from a waiter whose lock stays held.
const waitTime = time.Second

// Acquire implements driver.Locker. opts.TTL is the TTL of the session the
// lock's key is acquired by.
func (l *Locker) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	if err := checkName(key); err != nil {
		return nil, err
	}
	return l.retry(ctx, opts, func(a *attempt) (driver.Lease, error) {
		a.key = LockKey(key)
		switch {
		case opts.Wait && opts.Fair:
			return a.queue(ctx)
		case opts.Wait:
			// One attempt first, which is all a free lock costs; a held
			// lock is then waited for in the queue, where a release wakes
			// one waiter, not all of them, each to send a transaction of
			// which all but one fail. Later arrivals still barge in with
			// their first attempt: this is not fair.
			if le, err := a.lock(ctx, 0, ""); le != nil || err != nil {
				return le, err
			}
			return a.queue(ctx)
		}
		return a.take(ctx, false, "", nil)
	})
}

// attempt is one contender, with a session that is alive.
type attempt struct {
	l     *Locker
	s     *session
	key   string // the lock key, for Acquire
	label string // the key's value: the holder's label, for Inspect
	fair  bool   // AcquireOptions.Fair
}

// retry runs one attempt, with a session that is alive, and when opts.Wait
// is set starts over after every failure to reach Consul, with backoff,
// until ctx is done; a refusal (errRefused, as for want of ACL rights) is
// returned at once.
func (l *Locker) retry(ctx context.Context, opts driver.AcquireOptions, try func(*attempt) (driver.Lease, error)) (driver.Lease, error) {
	backoff := driver.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		s, err := l.session(ctx, opts.TTL)
		var lease driver.Lease
		if err == nil {
			lease, err = try(&attempt{l: l, s: s, label: opts.Owner, fair: opts.Fair})
		}
		if err == nil || !opts.Wait || !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, errClosed) || errors.Is(err, errRefused) {
			return lease, err
		}
		if err := driver.Sleep(ctx, backoff.Next(), nil); err != nil {
			return nil, err
		}
	}
}

// take acquires the lock key, waiting for it when wait is set; queued is
// the caller's queue key, deleted in the same transaction as the
// acquisition ("" for none). seen is the lock key as last read, nil when
// absent or not read: a key held by a session is waited for before any
// attempt (the first in the queue finds its predecessor, which left the
// queue by acquiring the lock, most likely still holding it).
//
// A waiter that is not fair and loses an attempt to a contender that came
// in ahead of the queue (most often the releaser, asking again at once)
// yields to it: it sleeps for yieldFor, sending nothing, then waits for the
// key to be free and attempts at once at every release, as before its
// loss. Each attempt that fails is a write through Raft, as costly to the
// servers as one that succeeds, and one that loses to the releaser forces
// the releaser back through the queue too; a releaser that keeps asking
// again meanwhile takes the lock from itself without the waiter's
// attempts. It holds the waiter back by yieldFor at most (and the race
// after it), never indefinitely.
func (a *attempt) take(ctx context.Context, wait bool, queued string, seen *api.KVPair) (driver.Lease, error) {
	var free uint64 // 0: the key is believed absent
	if seen != nil {
		free = seen.ModifyIndex
		if seen.Session != "" {
			var err error
			if free, _, err = a.waitFree(ctx, seen.ModifyIndex); err != nil {
				return nil, err
			}
		}
	}
	yielded := a.fair
	for {
		le, err := a.lock(ctx, free, queued)
		if le != nil || err != nil {
			return le, err
		}
		if !wait {
			return nil, driver.ErrNotAcquired
		}
		if !yielded {
			yielded = true
			if err := a.yield(ctx); err != nil {
				return nil, err
			}
		}
		if free, _, err = a.waitFree(ctx, 0); err != nil {
			return nil, err
		}
	}
}

// yield sleeps for yieldFor, or until ctx ends (its error) or the session
// does (errSessionLost).
func (a *attempt) yield(ctx context.Context) error {
	t := time.NewTimer(yieldFor)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-a.s.done:
	case <-a.s.ctx.Done():
	}
	return errSessionLost
}

// yieldFor is how long a waiter that lost an attempt to a contender ahead
// of the queue yields to it (see take).
//
// The waiter yields once in its turn at the head, so yieldFor sets how often
// a releaser that keeps asking again is made to hand over: each handover
// costs the lost attempts around it and the releaser's way back through the
// queue, writes all. Counted with 8 contenders on one key (guard.Do, hold 0
// and 1 ms) when the yielding waiter still watched the key, 10 ms left 2.47
// and 2.79 Raft writes per acquisition, 30 ms 2.26 and 2.45, against 2.0 for
// one that nobody contends. The waiter sleeps rather than watch the key: a
// releaser that keeps asking again changes the key twice a cycle, and a
// waiter that watched every change, to attempt when the key stayed free for
// a moment, cost the agent a blocking query for each: counted with 8
// contenders at hold 0 (BenchmarkContended), 1.22-1.37 queries per
// acquisition, against 0.16-0.18 for the sleeper, whose agent spent 18-35%
// less CPU per acquisition. The price is up to yieldFor more waiting for the
// head of the queue, with the lock free for the rest of it if the contender
// that won left at once and nobody else came; a fair waiter never yields.
const yieldFor = 30 * time.Millisecond

// lock acquires the lock key in one transaction, if it does not exist
// (free 0) or still has ModifyIndex free with no session (left behind by
// another tool), and reads it back in the same transaction for its
// ModifyIndex, the token. It returns no lease and no error when the lock is
// held.
//
// The transaction runs to completion even when ctx is cancelled (the lock
// is then released before lock returns ctx's error), because a request
// cancelled in flight could still be applied; when its outcome stays
// unknown, the session is given up, so that a key it may have acquired goes
// with it. A transaction Consul refused (errRefused) applied nothing, and
// costs the session's other locks nothing.
func (a *attempt) lock(ctx context.Context, free uint64, queued string) (driver.Lease, error) {
	done := a.s.pending(a.key)
	defer done()
	return a.lockAt(ctx, free, queued, done)
}

// lockAt is lock, within the acquisition under way that done ends.
func (a *attempt) lockAt(ctx context.Context, free uint64, queued string, done func()) (driver.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	check := &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: a.key}
	if free != 0 {
		check = &api.KVTxnOp{Verb: api.KVCheckIndex, Key: a.key, Index: free}
	}
	ops := api.KVTxnOps{
		check,
		{Verb: api.KVLock, Key: a.key, Value: []byte(a.label), Session: a.s.id},
	}
	if queued != "" {
		ops = append(ops, &api.KVTxnOp{Verb: api.KVDelete, Key: queued})
	}
	ops = append(ops, &api.KVTxnOp{Verb: api.KVGet, Key: a.key})
	rctx, cancel := a.l.detached(ctx)
	defer cancel()
	ok, resp, err := txn(rctx, a.l.client, ops)
	if err != nil {
		// A refusal applied nothing; any other failure may have.
		if refusal(err) == nil {
			a.s.giveUp()
		}
		return nil, a.l.fail(ctx, rctx, err)
	}
	if !ok {
		// Consul reports every op that failed. The check failing means
		// the key exists: held by another session when the lock verb
		// fails too, else without a session or held by this one (see
		// lockSessionless). The lock verb failing alone means the
		// session is gone, or that the key is in
		// the lock-delay of another tool's session (see the package
		// documentation), which Consul checks before the rest and says
		// so last (an escaped key holds no space).
		if err := denied(resp); err != nil {
			return nil, err
		}
		what := "transaction refused"
		checked, locked := true, true
		for _, e := range resp.Errors {
			switch e.OpIndex {
			case 0:
				checked = false
			case 1:
				locked = false
				what = e.What
			default:
				what = e.What
			}
		}
		switch {
		case !checked && locked && free == 0:
			return a.lockSessionless(ctx, queued, done)
		case !checked:
			return nil, nil
		case strings.HasSuffix(what, " due to lock delay"):
			return nil, fmt.Errorf("%w: consul: %s", driver.ErrUnavailable, what)
		}
		return nil, fmt.Errorf("%w: %s", errSessionLost, what)
	}
	// The read is the last op: a check-index before it returns the key as
	// it was before the acquisition.
	for _, kv := range slices.Backward(resp.Results) {
		if kv.Key == a.key {
			return a.granted(ctx, kv, done)
		}
	}
	return a.granted(ctx, &api.KVPair{Key: a.key}, done)
}

// lockSessionless follows an attempt on a key believed absent that found
// the key, but whose lock verb alone would have taken it: the key has no
// session (written by hand, or left behind by another tool, which Inspect
// reports as free), or it is this session's (another acquisition of this
// Locker holds it). It reads the key, and acquires it, checked on its
// ModifyIndex, in the first case; without that, an acquisition that does
// not wait would find such a key held for as long as it stood.
func (a *attempt) lockSessionless(ctx context.Context, queued string, done func()) (driver.Lease, error) {
	rctx, cancel := a.l.rctx(ctx)
	kv, _, err := a.l.client.KV().Get(a.key, queryOpts(rctx))
	err = a.l.fail(ctx, rctx, err)
	cancel()
	switch {
	case err != nil:
		return nil, err
	case kv == nil || kv.Session != "":
		return nil, nil
	}
	return a.lockAt(ctx, kv.ModifyIndex, queued, done)
}

// granted returns the lease of kv, a read of the key just acquired, unless
// ctx ended meanwhile (the key is then released) or the session was lost.
// done ends the acquisition under way (see session.pending); a grant
// whose ctx ended ends it before its release, which would otherwise count
// it as another acquisition that may hold the key (see superseded), and
// leave a key written over meanwhile to the session.
func (a *attempt) granted(ctx context.Context, kv *api.KVPair, done func()) (driver.Lease, error) {
	le := &lease{s: a.s, key: kv.Key, token: kv.ModifyIndex, created: kv.CreateIndex}
	if err := ctx.Err(); err != nil {
		done()
		// Bounded: a release that gets no answer goes on in the
		// background.
		rctx, cancel := a.l.detached(ctx)
		le.Release(rctx)
		cancel()
		return nil, err
	}
	if a.s.lost() {
		return nil, errSessionLost
	}
	a.s.track(le)
	return le, nil
}

// waitFree waits, with blocking queries on the lock key from index (0: a
// consistent read first), until the key is gone (it returns 0) or has no
// session (it returns its ModifyIndex); it also returns the index of the
// read that found it so.
func (a *attempt) waitFree(ctx context.Context, index uint64) (free, at uint64, err error) {
	for {
		kv, idx, err := a.get(ctx, a.key, index)
		if err != nil {
			return 0, 0, err
		}
		switch {
		case kv == nil:
			return 0, idx, nil
		case kv.Session == "":
			return kv.ModifyIndex, idx, nil
		}
		index = nextIndex(index, idx)
	}
}

// nextIndex is the index of the blocking query that follows a read at index
// that returned idx. An index that went backwards (Consul resets it, after
// a snapshot restore for instance) starts over with a consistent read
// rather than a query that would return at once, again and again.
func nextIndex(index, idx uint64) uint64 {
	if idx < index {
		return 0
	}
	return idx
}

// get reads key; see read.
func (a *attempt) get(ctx context.Context, key string, index uint64) (*api.KVPair, uint64, error) {
	return read(ctx, a, index, func(q *api.QueryOptions) (*api.KVPair, *api.QueryMeta, error) {
		return a.l.client.KV().Get(key, q)
	})
}

// read makes one read, do, with the query options it is given, and returns
// what it read and its index. With index 0 it is a consistent read.
// Otherwise it is first a blocking query that returns once the index passes
// index, or after waitTime (see blockingQuery), bounded by queryBound and by
// ctx and the session, which it outlives by nothing; when that query fails
// or gets no answer in time (a frozen leader keeps the connection open and
// answers nothing), a consistent read re-checks at once, rather than the
// waiter sleeping on what may be a free key.
//
// The consistent read is sent until answered, as a release is
// (untilAnswered), until ctx ends or the session does: a waiter keeps its
// place (its key, which its session keeps) through a leader election,
// rather than giving it up, which would take a write that an election may
// leave unanswered too. A refusal (errRefused: a token deleted or stripped
// of its rights while it waits) is an answer, returned at once.
func read[T any](ctx context.Context, a *attempt, index uint64, do func(*api.QueryOptions) (T, *api.QueryMeta, error)) (T, uint64, error) {
	wctx, cancel := a.s.whileAlive(ctx)
	defer cancel()
	if index != 0 {
		v, idx, ok := blockingQuery(wctx, index, waitTime, do)
		switch {
		case ok:
			return v, idx, nil
		case ctx.Err() != nil:
			return v, 0, ctx.Err()
		case a.s.lost():
			return v, 0, errSessionLost
		}
	}
	var (
		mu      sync.Mutex
		got     bool
		v       T
		idx     uint64
		refused error
	)
	err := untilAnswered(wctx, a.l.timeout, func(rctx context.Context) error {
		r, meta, err := do((&api.QueryOptions{RequireConsistent: true}).WithContext(rctx))
		no := refusal(err)
		if err != nil && no == nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if !got {
			got, v, idx, refused = true, r, 0, no
			if meta != nil {
				idx = max(meta.LastIndex, 1)
			}
		}
		return nil
	})
	switch {
	case err == nil && refused != nil:
		return v, 0, refused
	case err == nil:
		return v, idx, nil
	case ctx.Err() == nil && a.s.lost():
		return v, 0, errSessionLost
	}
	return v, 0, a.l.fail(ctx, wctx, err)
}

// blockingQuery makes do a blocking query from index, waiting up to wait,
// and returns what it read and its index, or false when it failed or got
// no answer within queryBound(wait).
//
// The query is not stale: the agent forwards it to the leader, which wakes
// it as soon as it commits a change. A stale query, answered by whichever
// server the agent asks, would outlive a frozen leader when that server is
// a follower, but measured worse in the cluster scenarios: a follower
// applies a release after the leader has answered it, so a waiter woken
// there loses the race to the releaser coming back for the lock (waiters
// went 12 s without a grant while the releaser took the lock again and
// again), and the lock came back later after a freeze. The bound, not
// staleness, rescues a waiter whose query went to a frozen leader.
func blockingQuery[T any](ctx context.Context, index uint64, wait time.Duration, do func(*api.QueryOptions) (T, *api.QueryMeta, error)) (T, uint64, bool) {
	rctx, cancel := context.WithTimeout(ctx, queryBound(wait))
	defer cancel()
	q := &api.QueryOptions{WaitIndex: index, WaitTime: wait}
	v, meta, err := do(q.WithContext(rctx))
	if err != nil {
		return v, 0, false
	}
	return v, max(meta.LastIndex, 1), true
}

// queryBound is the client's bound on a blocking query of wait: the server
// answers it within wait plus its jitter of up to wait/16, and queryGrace
// covers the round trip and a busy machine. A query unanswered by then went
// to a server that stopped answering.
func queryBound(wait time.Duration) time.Duration { return wait + wait/16 + queryGrace }

const queryGrace = 250 * time.Millisecond

// queue is a waiting acquisition: the contender acquires a queue key of
// its own, by its session, under the lock's queue directory, reading the
// lock key and the directory in the same transaction; it waits for the queue key just before
// its own (by CreateIndex) to go, and, once first, for the lock key, which
// it acquires while deleting its queue key in one transaction. A release
// thus wakes one waiter, not all of them.
func (a *attempt) queue(ctx context.Context) (driver.Lease, error) {
	// The lock key is a prefix of its queue's: one read of it is a read of
	// both, and tells the first in the queue whether the lock is held.
	own := queueDir(a.key) + a.l.queueName(a.s)
	tree, err := a.enqueue(ctx, a.key, own, 0)
	if err != nil {
		return nil, err
	}
	le, err := a.waitTurn(ctx, own, tree)
	if err != nil {
		return nil, a.abort(ctx, own, err)
	}
	return le, nil
}

// enqueue acquires own, a contender key under dir, by the session, with
// flags, and reads every key with the prefix dir in the same transaction. The transaction runs to
// completion even when ctx is cancelled; when its outcome stays unknown, the
// session is given up, so that the key goes with it.
func (a *attempt) enqueue(ctx context.Context, dir, own string, flags uint64) ([]*api.KVPair, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rctx, cancel := a.l.detached(ctx)
	defer cancel()
	ok, resp, err := txn(rctx, a.l.client, api.KVTxnOps{
		{Verb: api.KVLock, Key: own, Value: []byte(a.label), Flags: flags, Session: a.s.id},
		{Verb: api.KVGetTree, Key: dir},
	})
	if err != nil {
		// A refusal applied nothing; any other failure may have.
		if refusal(err) == nil {
			a.s.giveUp()
		}
		return nil, a.l.fail(ctx, rctx, err)
	}
	if !ok {
		if err := denied(resp); err != nil {
			return nil, err
		}
		return nil, errSessionLost
	}
	return resp.Results, nil
}

// waitTurn waits until own is the oldest queue key, then takes the lock.
// tree is a read of the keys with the lock key as prefix, which includes
// own.
func (a *attempt) waitTurn(ctx context.Context, own string, tree []*api.KVPair) (driver.Lease, error) {
	for {
		// The prefix also covers the keys of names that continue this
		// one ("a.lock" and "a.lockb.lock"): only the lock key and its
		// queue count.
		var lock *api.KVPair
		queue := tree[:0:0]
		for _, kv := range tree {
			switch {
			case kv.Key == a.key:
				lock = kv
			case strings.HasPrefix(kv.Key, queueDir(a.key)):
				queue = append(queue, kv)
			}
		}
		pred, ok := predecessor(own, queue)
		if !ok {
			return nil, errSessionLost
		}
		if pred == nil {
			return a.take(ctx, true, own, lock)
		}
		// The predecessor may have been a waiter that gave up, with
		// others still before it: the queue is read again.
		if err := a.waitGone(ctx, pred); err != nil {
			return nil, err
		}
		var err error
		if tree, _, err = a.list(ctx, a.key, 0); err != nil {
			return nil, err
		}
	}
}

// predecessor returns the queue key created just before own in tree, nil
// when own is the oldest, and false when own is not in tree (its session
// ended).
func predecessor(own string, tree []*api.KVPair) (*api.KVPair, bool) {
	var mine *api.KVPair
	for _, kv := range tree {
		if kv.Key == own {
			mine = kv
		}
	}
	if mine == nil {
		return nil, false
	}
	var pred *api.KVPair
	for _, kv := range tree {
		if kv.CreateIndex < mine.CreateIndex && (pred == nil || kv.CreateIndex > pred.CreateIndex) {
			pred = kv
		}
	}
	return pred, true
}

// abort deletes own, the queue key of an attempt that failed or was
// cancelled, and returns cause. The key is this attempt's alone. If the
// delete cannot be confirmed, the key would stand before every later fair
// waiter for as long as the session lives, so the session is given up
// instead, and the key goes with it.
func (a *attempt) abort(ctx context.Context, own string, cause error) error {
	if a.s.lost() {
		return cause
	}
	rctx, cancel := a.l.detached(ctx)
	defer cancel()
	if _, err := a.l.client.KV().Delete(own, writeOpts(rctx)); err != nil {
		a.s.giveUp()
	}
	return cause
}

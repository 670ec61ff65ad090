package consullock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	// created is the key's CreateIndex when it was acquired (see holds).
	created uint64

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
	le.s.mu.Lock()
	revoked := le.revoked
	le.s.mu.Unlock()
	if !le.holds(kv) || revoked {
		return fmt.Errorf("%w: key gone, or taken by a later acquisition", driver.ErrNotHeld)
	}
	return nil
}

// holds reports whether kv, a read of the lease's key, is still the
// lease's holding: the key its acquisition created or took, acquired by
// its session. A write over the key (consul kv put) keeps both, while it
// changes the key's ModifyIndex, the token; a release or a forced release
// deletes the key, and a later acquisition creates it anew.
func (le *lease) holds(kv *api.KVPair) bool {
	return kv != nil && kv.Session == le.s.id && kv.CreateIndex == le.created
}

// Release deletes the lock key if it is still this lease's (the same
// ModifyIndex), so a stale or retried release never deletes a newer
// holder's key; a key written over since (consul kv put), still acquired
// by the session, is deleted too (see releaseWrittenOver).
//
// A lease whose session has ended (lost, given up, or closed with the
// Locker) is not sent anything: its key went, or goes, with the session.
// Release then returns ErrNotHeld at once. A delete that gets no answer (a
// leader killed or frozen with it in flight) may or may not have been
// applied, and the session's renewal would keep a key it missed, and the
// lock, forever: it is sent again (see resendRelease) while the session
// keeps every other lock, and Release waits for that no longer than ctx,
// returning an error wrapping driver.ErrUnavailable when ctx ends first;
// the resend then goes on in the background. A delete that Consul refuses
// (errRefused, as for a token stripped of its rights, or not yet known to
// a secondary datacenter's servers) is sent again the same way: a refusal
// may last a moment or cover this key alone, and giving the session up at
// once would cost every other lock it keeps, as the renewals, which ride
// out a refusal until the loss deadline, do not.
//
// A resend that finds the key gone counts it as released by an earlier
// send, and Release returns nil, though a forced release
// (ForceRelease) may have taken the key instead, before the first send or
// while its outcome was unknown: Release cannot tell the two apart, and
// returns nil where ErrNotHeld would be true. The revocation watch
// (OnRevoke) covers only part of that: it reports a forced release that
// it has seen before Release begins, and Release stops it (the section is
// over), so a forced release it had not yet seen, as when Consul is
// electing a leader, goes unreported.
func (le *lease) Release(ctx context.Context) error {
	s := le.s
	s.forget(le)
	if s.lost() {
		return fmt.Errorf("%w: consul session lost before release", driver.ErrNotHeld)
	}
	l := s.l
	// Not answered within resendAfter, the release is sent again, in
	// the background (see untilAnswered).
	bound := min(l.timeout, resendAfter)
	rctx, cancel := context.WithTimeout(ctx, bound)
	ok, err := l.sendRelease(rctx, le.key, le.token)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		err = fmt.Errorf("%w: consul: no answer within %v", driver.ErrUnavailable, bound)
	} else {
		err = l.fail(ctx, rctx, err)
	}
	cancel()
	switch {
	case err == nil && !ok:
		// A refusal of its read or delete is sent again, as one of the
		// release's own.
		if err = le.releaseWrittenOver(ctx); !errors.Is(err, errRefused) {
			return err
		}
	case err == nil:
		return nil
	}
	// The loss deadline as of the failure: had Consul answered nothing
	// since, or refused everything (the renewals too), the session would
	// be lost then anyway, with every lock it keeps, so giving it up then
	// costs its other locks nothing the same outage would not have, and
	// the lock comes back no later than had its holder crashed.
	deadline := s.Expiry().Add(-s.margin())
	done := make(chan error, 1)
	if !s.spawn(func() { done <- le.resendRelease(deadline) }) {
		return fmt.Errorf("%w: consul session lost before release", driver.ErrNotHeld)
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: consul: release unanswered or refused (%w); resent in the background until %s, when the session is given up",
			driver.ErrUnavailable, err, deadline.Format(time.RFC3339Nano))
	}
}

// releaseWrittenOver releases the holding after its release found the
// key's ModifyIndex changed: the key is gone (a forced release, or an
// operator deleted it), and Release returns ErrNotHeld, or it was written
// over (consul kv put), which changes its ModifyIndex but keeps it
// acquired by the session, whose renewal would keep it, and the lock, for
// as long as the session lives. A key that is still the lease's holding
// (holds) is deleted, checked on its new ModifyIndex, unless a later
// acquisition of the session holds it (superseded): an operator's unlock
// (consul kv put -release) keeps the key and its CreateIndex, and the
// Locker's next acquisition takes it as it stands. An acquisition under
// way at the read may have been granted the key before it, and not be
// tracked yet: the release waits for those to end before it judges (not
// giving up on the key for their sake, since one that finds the key held by
// its own session gives up too, and the key would be left to no one). The
// check follows the read: a grant after it changes the key's ModifyIndex,
// which fails the delete. Its requests run to completion even when ctx is
// cancelled, since one that fails leaves such a key in doubt: the session is
// then given up, and the key goes with it. One that Consul refuses
// (errRefused) applied nothing, and may be refused for a moment only: it is
// returned with the session kept, and the caller sends the release again
// until the session's loss deadline, as it does a refused release (see
// Release).
func (le *lease) releaseWrittenOver(ctx context.Context) error {
	l := le.s.l
	for {
		rctx, cancel := l.detached(ctx)
		kv, _, err := l.client.KV().Get(le.key, queryOpts(rctx))
		held := err == nil && le.holds(kv)
		later, underWay := le.s.superseded(le)
		if held && !later && underWay != 0 {
			if err = le.s.settled(rctx, le.key, underWay); err == nil {
				later, _ = le.s.superseded(le)
			}
		}
		ok, mine := false, err == nil && held && !later
		if mine {
			ok, err = l.sendRelease(rctx, le.key, kv.ModifyIndex)
		}
		err = l.fail(ctx, rctx, err)
		cancel()
		switch {
		case err == nil && !mine:
			return fmt.Errorf("%w: key gone before release, or taken by a later acquisition", driver.ErrNotHeld)
		case err == nil && ok:
			return nil
		case err == nil && ctx.Err() == nil:
			continue // written over again since the read
		case errors.Is(err, errRefused):
			return err
		}
		le.s.giveUp()
		return fmt.Errorf("%w; consul session given up, which deletes the key", cmp.Or(err, ctx.Err()))
	}
}

// resendRelease sends the lease's release again, after a send whose
// outcome is unknown or that Consul refused, until Consul answers, and
// applies it or finds it already applied: the check on the ModifyIndex
// keeps any send from deleting a newer holder's key. A send that finds the
// key's ModifyIndex changed hands over to releaseWrittenOver, which tells
// a key released by an earlier send (gone) from one written over since
// (consul kv put), still the lease's holding and kept by the session, which
// it deletes; a read or delete of releaseWrittenOver's that Consul refuses
// is sent again, with the release. When the key is not known released by
// deadline (the session's loss deadline as of the first failure), the
// session is given up, and the key goes with it; when the session ends
// first, the key goes with it too. It returns nil once the key is known
// released, an error wrapping driver.ErrUnavailable otherwise.
func (le *lease) resendRelease(deadline time.Time) error {
	s := le.s
	l := s.l
	ctx, cancel := s.whileAlive(context.Background())
	defer cancel()
	ctx, cancel2 := context.WithDeadline(ctx, deadline)
	defer cancel2()
	var applied atomic.Bool
	send := func(rctx context.Context) error {
		ok, err := l.sendRelease(rctx, le.key, le.token)
		if ok {
			applied.Store(true)
		}
		return err
	}
	pause := driver.Backoff{Min: resendPause / 4, Max: resendPause}
	err := untilAnswered(ctx, l.timeout, send)
	for err == nil && !applied.Load() {
		err = le.releaseWrittenOver(ctx)
		switch {
		case err == nil || errors.Is(err, driver.ErrNotHeld):
			// Gone: released by an earlier send, or by a forced
			// release (which Release cannot tell apart; see Release).
			return nil
		case !errors.Is(err, errRefused):
			return err // the session given up
		}
		if driver.Sleep(ctx, pause.Next(), nil) != nil {
			break
		}
		err = untilAnswered(ctx, l.timeout, send)
	}
	switch {
	case err == nil:
		return nil
	case s.lost():
		return fmt.Errorf("%w: consul: release unanswered or refused until its session ended, which takes the key: %w", driver.ErrUnavailable, err)
	}
	s.giveUp()
	return fmt.Errorf("%w: consul: release unanswered or refused until the session's loss deadline; session given up: %w", driver.ErrUnavailable, err)
}

// untilAnswered sends, again when a send fails and also every resendAfter
// while none has been answered, leaving the earlier ones outstanding, until
// one is answered: it returns nil then. At most maxOutstanding sends are
// outstanding at once: a send that falls due while that many are goes out
// as soon as one of them returns. Each send is bounded by timeout, and all
// of them by ctx; it returns the last failure once ctx ends. It returns
// when no send runs any more.
//
// Sends go out while earlier ones are still outstanding because Consul
// holds a request that reaches a server during a leader election, and
// checks again for a leader only at growing intervals (437 ms, then
// doubling, with its default rpc_hold_timeout of 7 s): one held through an
// election may be forwarded a second or more after the new leader serves,
// where a fresh one is forwarded at once. send must therefore be safe to
// apply more than once, and late.
func untilAnswered(ctx context.Context, timeout time.Duration, send func(context.Context) error) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	answers := make(chan error)
	outstanding := 0
	due := false // a send fell due while maxOutstanding were outstanding
	err = errors.New("no answer")
	next := time.NewTimer(0)
	defer next.Stop()
	sendNow := func() {
		outstanding++
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, timeout)
			err := send(rctx)
			cancel()
			select {
			case answers <- err:
			case <-ctx.Done():
			}
		})
		next.Reset(resendAfter)
	}
	pause := driver.Backoff{Min: resendPause / 4, Max: resendPause}
	for {
		select {
		case <-next.C:
			if outstanding >= maxOutstanding {
				due = true
				continue
			}
			sendNow()
		case e := <-answers:
			outstanding--
			if e == nil {
				return nil
			}
			err = e
			switch {
			case due:
				due = false
				sendNow()
			case outstanding == 0:
				// Refused at once (no agent, no leader): again after
				// a short pause.
				next.Reset(pause.Next())
			}
		case <-ctx.Done():
			return err
		}
	}
}

// maxOutstanding caps the sends of one untilAnswered outstanding at once.
// Each holds an HTTP connection to the agent, which by default refuses a
// client address more than 200 (limits.http_max_conns_per_client), session
// renewals included: uncapped, a send every resendAfter bounded by the
// 5 s request timeout keeps about 10 per release or waiter through an
// election, so 20 of them would cut the process off and lose every lock.
// With 3, some 60 can be in doubt at once. Three sends resendAfter apart
// suffice to ride out an election: Consul re-checks a held request for a
// leader 437 ms, 1.3 s, 3.1 s and 6.6 s after it arrives, so three sends
// 0.5 s apart interleave those re-checks to within about a second of one
// another until the first send's timeout lets a fresh one go, and a leader
// that serves again is found within about a second, as with no cap.
const maxOutstanding = 3

// resendAfter is how long a send that is safe to repeat (an owner-checked
// release, a read) may go unanswered before another follows it; see
// untilAnswered.
const resendAfter = 500 * time.Millisecond

// resendPause caps the pause before sending again after a send failed.
const resendPause = 200 * time.Millisecond

// sendRelease sends release(key, token), and reports whether Consul
// applied it; a transaction refused for want of rights, which Consul
// reports as one that failed, is errDenied.
func (l *Locker) sendRelease(ctx context.Context, key string, token uint64) (bool, error) {
	ok, resp, err := txn(ctx, l.client, release(key, token))
	if err == nil && !ok {
		err = denied(resp)
	}
	return ok, err
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

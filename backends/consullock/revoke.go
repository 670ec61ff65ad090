package consullock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// RevokedPrefix is the Consul KV prefix under which ForceRelease tells a
// holder's session that its lock was taken:
// <RevokedPrefix><session id>/<lock key>/<CreateIndex>, the key's
// CreateIndex, which a write over the key (consul kv put) keeps, where it
// changes the ModifyIndex, the holder's token. The marker is acquired
// by the holder's own session, so it never outlives that session (Behavior
// delete), and the session deletes it once it has seen it. A lock key has
// no '/' before its ".lock" suffix, so none lies under this prefix. With
// Consul's ACLs on, the users of a Locker need read and write access to
// it, with no narrower rule under it: without it, every acquisition fails
// with Consul's refusal, and a session that loses it while it holds locks
// is given up, since its holders would not learn of a forced release (see
// the package documentation, ACLs).
const RevokedPrefix = "warden/revoked/"

var _ driver.RevocableLease = (*lease)(nil)

// revocation names one removed holding of a session: its lock key and
// CreateIndex. Of the session's leases, only the latest granted of a key
// holds it (see track), so that names one lease.
type revocation struct {
	key     string
	created uint64
}

// revokedDir is the directory of the markers of session id.
func revokedDir(id string) string { return RevokedPrefix + id + "/" }

// marker is the key of the marker of a forced release of the holding of
// session id of lockKey, created at index created.
func marker(id, lockKey string, created uint64) string {
	return revokedDir(id) + lockKey + "/" + strconv.FormatUint(created, 10)
}

// track registers le, just granted, so that a marker naming it finds it;
// one that arrived first is applied at once. An earlier lease of the
// session on the same key is revoked: the key was taken from it (a forced
// release, or an operator's unlock) before this grant, which took the key
// anew or as it stood (see lockSessionless), with the same CreateIndex.
func (s *session) track(le *lease) {
	s.mu.Lock()
	old := s.leases[le.key]
	var f func()
	if old != nil {
		delete(s.leases, le.key)
		old.revoked = true
		f, old.onRevoke = old.onRevoke, nil
	}
	r := revocation{le.key, le.created}
	if s.revoked[r] {
		delete(s.revoked, r)
		le.revoked = true
	} else {
		s.leases[le.key] = le
	}
	s.mu.Unlock()
	if f != nil && !s.lost() {
		f()
	}
}

// pending marks an acquisition of key by the session under way until the
// function it returns is first called, after the acquisition was granted
// (and tracked) or failed. The forced releases seen for key meanwhile are
// forgotten once the last such acquisition ended: none can name a later
// one.
func (s *session) pending(key string) (done func()) {
	s.mu.Lock()
	s.seq++
	id := s.seq
	s.acquiring[key] = append(s.acquiring[key], id)
	s.mu.Unlock()
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.acquiring[key] = slices.DeleteFunc(s.acquiring[key], func(i uint64) bool { return i == id })
		if len(s.acquiring[key]) == 0 {
			delete(s.acquiring, key)
			maps.DeleteFunc(s.revoked, func(r revocation, _ bool) bool { return r.key == key })
		}
	})
}

// superseded reports whether the session granted le's key to a later
// acquisition, which then holds it with the same CreateIndex (le was
// revoked, or another lease of the key is tracked), and the latest of its
// acquisitions of the key under way (0 for none), any of which may have
// been granted it and not be tracked yet. Only the latest grant holds the
// key.
func (s *session) superseded(le *lease) (later bool, underWay uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.leases[le.key]
	if ids := s.acquiring[le.key]; len(ids) > 0 {
		underWay = slices.Max(ids)
	}
	return le.revoked || (cur != nil && cur != le), underWay
}

// settled waits until the session's acquisitions of key up to the one
// numbered upTo have ended (each is one transaction, bounded by the
// Locker's request timeout): those begun later are not waited for, so
// that a Locker trying the key without a pause cannot keep the wait going.
// It fails when the session ended (errSessionLost: its keys go with it) or
// ctx did first.
func (s *session) settled(ctx context.Context, key string, upTo uint64) error {
	pause := driver.Backoff{Min: time.Millisecond, Max: 50 * time.Millisecond}
	for {
		if s.lost() {
			return errSessionLost
		}
		s.mu.Lock()
		ended := !slices.ContainsFunc(s.acquiring[key], func(i uint64) bool { return i <= upTo })
		s.mu.Unlock()
		if ended {
			return nil
		}
		if err := driver.Sleep(ctx, pause.Next(), s.done); err != nil {
			return err
		}
	}
}

// forget drops le: it was released. A revocation found later is not
// reported.
func (s *session) forget(le *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases[le.key] == le {
		delete(s.leases, le.key)
	}
	le.onRevoke = nil
}

// OnRevoke implements driver.RevocableLease. A forced release
// (ForceRelease) leaves a marker that the session's one blocking query on
// its markers receives; f is called on that query's goroutine, or at once
// when the marker has already been seen.
func (le *lease) OnRevoke(f func()) {
	s := le.s
	s.mu.Lock()
	switch {
	case le.revoked:
	case s.leases[le.key] == le && !s.lost():
		le.onRevoke = f
		f = nil
	default:
		f = nil // released or its session lost: nothing to report
	}
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// revoke reports the forced release r to the lease it names, and keeps it
// for an acquisition of its key under way, whose grant it may name: a
// marker can arrive before the acquisition returns. A marker that names
// neither (its lease released) is dropped.
func (s *session) revoke(r revocation) {
	s.mu.Lock()
	le := s.leases[r.key]
	var f func()
	if le != nil && le.created == r.created {
		delete(s.leases, r.key)
		le.revoked = true
		f, le.onRevoke = le.onRevoke, nil
	}
	if len(s.acquiring[r.key]) > 0 {
		s.revoked[r] = true
	}
	s.mu.Unlock()
	if f != nil && !s.lost() {
		f()
	}
}

// anchor acquires the key of the session's marker directory by the
// session (see watchRevocations).
func (s *session) anchor(ctx context.Context) error {
	rctx, cancel := s.l.rctx(ctx)
	defer cancel()
	ok, _, err := s.l.client.KV().Acquire(&api.KVPair{Key: revokedDir(s.id), Session: s.id}, writeOpts(rctx))
	switch {
	case err != nil:
		return s.l.fail(ctx, rctx, err)
	case !ok:
		return errSessionLost
	}
	return nil
}

// revocationWait is how long the query on the markers of a Store's session
// waits on the server before it is sent again, and the most that of a
// Locker's session waits (see holderWait).
const revocationWait = 5 * time.Minute

// holderWait is how long the query on the markers of a session of ttl that
// holds locks waits on the server: the longest whose bound (queryBound) is
// the session's renewal period, so that a query whose connection died
// silently (a NAT, a firewall or a proxy that drops an idle long poll
// without a reset) is given up, and the markers read on another
// connection, within a renewal period of a forced release, rather than
// after revocationWait, while a forced release has let another holder in.
// The cost is one query per wait, about one per renewal, whatever the
// number of locks the session holds. It is never shorter than a waiter's
// (waitTime), which a TTL under 4 s (that Consul takes only with its
// session_ttl_min lowered) would make it, or not positive.
func holderWait(ttl time.Duration) time.Duration {
	return min(revocationWait, max(waitTime, (ttl/3-queryGrace)*16/17))
}

// watchRevocations keeps one blocking query on the session's marker
// directory until the session ends, reporting each marker and then
// deleting it. The first query, without an index, reads what is there
// already. A session that holds locks has each query wait holderWait, so
// that one whose connection died silently is found out within a renewal
// period; a Store's waits revocationWait.
//
// The directory's own key is acquired first, by the session (newSession
// does, before any lock is acquired by it), and stays until the session
// ends, when Consul deletes it: the query then returns, and has the
// session renewed at once, which finds it gone, so that its sections are
// cancelled within a round trip of its end rather than at the next
// renewal. Without that anchor, too, Consul would answer a blocking query
// on a prefix with no key under it with the whole KV store's index, and
// wakes it on writes near it, so without that anchor the query would
// return at every write to the store, from every session.
//
// A session that holds locks is given up, and its locks with it, once its
// markers may go unseen, rather than work on unable to tell a forced
// release from none: when Consul says it left keys out of a read
// (ResultsFilteredByACLs: a rule denies a marker, the session's directory
// or RevokedPrefix), or refuses anew, or does not grant, the anchor it
// left out of a read (the only sign Consul gives a request without a
// token, whose reads it filters without a word; see reanchor). The
// anchor's acquisition proved every marker readable when the session
// began, since a rule that hides a marker and not the anchor names the
// session, which did not exist before; rules changed later show at the
// first read by them after a marker is written, which wakes the query
// within a round trip (Consul judges a query by the rules as they were
// when it came, so a marker written while it waits is seen). A filtered
// read is the exception when its index is that of the last read not
// filtered: no key under the directory was written since, so it hides
// only keys that read saw (such as a marker reported already, whose
// delete a rule naming it, added since, refused, when the query is sent
// again after its wait). After any write there, a filtered read gives
// the session up: Consul does not say which keys it hid. A Store's
// session holds no locks, and no marker names it: it is kept.
//
// A read that fails hides nothing: a marker stays in the directory until
// seen, and the next answered read reports it. Whether Consul refused it (a
// token without list on the directory, under acl.enable_key_list_policy, or
// one it does not know for a moment, as a secondary datacenter's servers may
// not yet), answered it with an error (a 5xx, a 429 of a rate limit on reads
// that lets renewals through) or not at all, it is sent again, and the
// session given up when no read has been answered by the session's loss
// deadline as of the first failure, when it would have been lost had its
// renewals failed too: a failure of a moment costs its locks nothing, and a
// holder whose reads fail for good works on for up to nine tenths of the TTL
// without learning of a forced release. The read after a failure is sent
// without an index, so that it is answered at once, and without a pause
// after a query that waited retryDelay or more (after one that failed
// sooner, or a read without an index that failed, it pauses): a deadline is
// cleared by an answer, and a query cut after a long wait (by a proxy's
// response timeout, an agent's restart) or unanswered by its bound (its
// connection gone silent) counts only when the read sent after it fails too
// (net/http closes the connection of a request given up over HTTP/1.1, and
// sends the next on another; over HTTP/2, which a client of Consul over TLS
// speaks, the client's requests, renewals included, share a connection that
// a cancelled request leaves open, so one gone silent fails the renewals
// too, and the session is lost at its loss deadline). No marker is read
// while the anchor is acquired again (see reanchor): the loss deadline as of
// the read that found it gone bounds that acquisition and the reads after
// it, until one is answered.
func (s *session) watchRevocations() {
	dir := revokedDir(s.id)
	anchored := s.anchored
	holdsLocks := !s.l.anchorOptional
	wait := revocationWait
	if holdsLocks {
		wait = holderWait(s.ttl)
	}
	var index uint64
	// refusedUntil is the loss deadline as of the first of the reads
	// failed since the last answered; zero when the last was answered.
	var refusedUntil time.Time
	// whole is the index of the last read that Consul did not filter, the
	// greatest ModifyIndex of the keys under the directory then (or of
	// their tombstones): a key written since has a greater one.
	var whole uint64
	for {
		// Bounded like every request, so that a query sent to a server
		// that stopped answering is sent again.
		bound := s.l.timeout
		if index != 0 {
			bound = queryBound(wait)
		}
		if !refusedUntil.IsZero() {
			// No answer by the loss deadline is a failure at it.
			left := time.Until(refusedUntil)
			if left <= 0 {
				s.giveUp()
				return
			}
			bound = min(bound, left)
		}
		wctx, cancel := s.whileAlive(s.ctx)
		rctx, cancel2 := context.WithTimeout(wctx, bound)
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(rctx)
		sent := time.Now()
		pairs, meta, err := s.l.client.KV().List(dir, q)
		cancel2()
		cancel()
		if s.lost() {
			return
		}
		if err != nil {
			// The read after a query that waited goes at once: its
			// connection may be the one that failed, and it is answered
			// at once. A query refused as soon as sent (a proxy or a
			// rate limit that turns long polls away) pauses, as a read
			// without an index that failed does, so that an indexed
			// query failing at once and an unindexed read answered make
			// no loop without a pause.
			pause := retryDelay
			if index != 0 && time.Since(sent) >= retryDelay {
				pause = 0
			}
			index = 0
			if holdsLocks {
				if refusedUntil.IsZero() {
					refusedUntil = s.Expiry().Add(-s.margin())
				}
				// Given up at the deadline (above), not a pause after.
				pause = min(pause, time.Until(refusedUntil))
			}
			if driver.Sleep(s.ctx, pause, s.done) != nil {
				return
			}
			continue
		}
		refusedUntil = time.Time{}
		if meta.ResultsFilteredByACLs && holdsLocks {
			// Consul says that it left keys out, not which: they are
			// known to be keys already seen only when none under the
			// directory was written since the last whole read.
			if whole == 0 || meta.LastIndex != whole {
				s.giveUp()
				return
			}
			index = whole
			continue
		}
		whole = meta.LastIndex
		// An index that goes back (a snapshot restored) starts over.
		if index = meta.LastIndex; index < 1 {
			index = 1
		}
		// The markers read are reported before the anchor, whose
		// acquisition may take attempts.
		for _, p := range pairs {
			rest := strings.TrimPrefix(p.Key, dir)
			i := strings.LastIndexByte(rest, '/')
			if i < 0 {
				continue
			}
			token, err := strconv.ParseUint(rest[i+1:], 10, 64)
			if err != nil {
				continue
			}
			s.revoke(revocation{rest[:i], token})
			// Best effort: the marker goes with the session anyway.
			rctx, rcancel := s.l.rctx(s.ctx)
			_, _ = s.l.client.KV().Delete(p.Key, writeOpts(rctx))
			rcancel()
		}
		if anchored && !slices.ContainsFunc(pairs, func(p *api.KVPair) bool { return p.Key == dir }) {
			// The anchor went with the session (behaviour delete), or
			// someone deleted it: the renewal tells which, now rather
			// than at its next period.
			select {
			case s.renewNow <- struct{}{}:
			default:
			}
			var until time.Time // a Store's session: no deadline
			if holdsLocks {
				refusedUntil = s.Expiry().Add(-s.margin())
				until = refusedUntil
			}
			err := s.reanchor(until)
			index = 0
			switch {
			case s.lost():
				return
			case err != nil && holdsLocks:
				s.giveUp()
				return
			}
			anchored = err == nil
		}
	}
}

// reanchor acquires the session's anchor again, after a read of its
// markers left it out, until it is granted, refused (errRefused), or not
// granted (errSessionLost), or the session ends. A failure of another
// kind (no answer, as while Consul elects a leader) proves nothing, and
// giving up on the anchor for it would leave a client without a token,
// whose reads Consul filters without a word, unable to learn that its
// markers are hidden for the rest of the session: the attempts go on,
// spaced as a failed renewal's, and the renewal, asked for already, ends
// them if the session went. No marker is read meanwhile: a session that
// holds locks gives until, its loss deadline as of the read that found the
// anchor gone, at which they end with an error, as failed reads of the
// markers do (see watchRevocations). A Store's session, which holds no
// lock, gives none: its attempts go on until one is answered.
func (s *session) reanchor(until time.Time) error {
	for {
		actx, acancel := s.ctx, context.CancelFunc(func() {})
		if !until.IsZero() {
			actx, acancel = context.WithDeadline(s.ctx, until)
		}
		err := s.anchor(actx)
		acancel()
		if err == nil || errors.Is(err, errRefused) || errors.Is(err, errSessionLost) {
			return err
		}
		pause := retryDelay
		if !until.IsZero() {
			left := time.Until(until)
			if left <= 0 {
				return fmt.Errorf("consul: the revocation anchor not acquired again by the session's loss deadline: %w", err)
			}
			pause = min(pause, left)
		}
		if err := driver.Sleep(s.ctx, pause, s.done); err != nil || s.lost() {
			return errSessionLost
		}
	}
}

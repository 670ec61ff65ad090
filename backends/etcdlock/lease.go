package etcdlock

import (
	"context"
	"fmt"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

// lease is one holding: a key on a session's etcd lease. It is a
// driver.SessionLease: the session's keepalive keeps it, with every other
// key of the session, alive, so guard sends nothing for it and no goroutine
// runs for it. It is also a driver.RevocableLease, told of a forced release
// by the session's one watch.
//
// A held lock costs the heap a lease of 64 bytes and nothing else of the
// backend: its etcd key is not kept but built again, when needed, from the
// lock's name (the string Acquire was given, which guard keeps in any case
// while its table of names has room), and the session finds its leases on
// a list threaded through them rather than in a map by key.
type lease struct {
	s    *session
	name string // the lock's, as Acquire was given it
	// seq is the sequence number in the key's contender name, with
	// readerSeq set for a reader's key, under the lock's r/ directory.
	seq uint64
	rev int64 // the key's create revision

	// Guarded by s.mu: the session's list of the leases it tracks (see
	// track), and what to call when a forced release's marker is seen.
	// A lease whose marker was seen is off the list, with next pointing
	// at itself.
	prev, next *lease
	onRevoke   func()
}

// readerSeq marks a reader's key in lease.seq; sequence numbers, counted
// from 1, never reach it.
const readerSeq = 1 << 63

// number is the sequence number in the lease's contender name.
func (le *lease) number() uint64 { return le.seq &^ readerSeq }

// key returns the lease's etcd key: <KeyDir(name)>[r/]<session's lease id in
// hex>-<sequence number in hex>, built with as few allocations as the
// escape allows (one when the name needs no escaping).
func (le *lease) key() string {
	var buf [len(lockDir+readerDir) + contenderNameLen]byte
	tail := append(buf[:0], lockDir...)
	if le.seq&readerSeq != 0 {
		tail = append(tail, readerDir...)
	}
	tail = appendContenderName(tail, le.s.id, le.number())
	return url.PathEscape(le.name) + string(tail)
}

var _ driver.SessionLease = (*lease)(nil)

// Token is the key's create revision: etcd's revision counter only grows, so
// every later holder of the lock has a greater one.
func (le *lease) Token() uint64 { return uint64(le.rev) }

// Expiry is the session's.
func (le *lease) Expiry() time.Time { return le.s.Expiry() }

// Session implements driver.SessionLease.
func (le *lease) Session() driver.Session { return le.s }

// Refresh extends nothing: the session's keepalive, not Refresh, renews the
// etcd lease (every TTL/3, for all of the session's keys at once), and guard
// never calls it for a session lease. For whoever does, it checks that the
// lease still holds the lock, with one read: the key exists with this
// lease's create revision only while the etcd lease is alive on the server.
// The read is not keys-only: etcd 3.7 serves those from its index, which
// has no lease ids, and answers lease 0 for every key. ttl must be the TTL
// the lock was acquired with, since a session's TTL cannot change.
func (le *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := le.checkRefresh(ttl); err != nil {
		return err
	}
	var resp *clientv3.GetResponse
	err := le.s.l.members.do(ctx, le.s.timeout, false, func(rctx context.Context, c *clientv3.Client) error {
		var err error
		resp, err = c.Get(rctx, le.key())
		return err
	})
	if err != nil {
		return err
	}
	return le.verify(resp)
}

// checkRefresh is what Refresh can tell without asking the server.
func (le *lease) checkRefresh(ttl time.Duration) error {
	if ttl != le.s.ttl {
		return fmt.Errorf("%w: refresh with TTL %v of a lock acquired with %v: an etcd session's TTL cannot change",
			driver.ErrInvalidOption, ttl, le.s.ttl)
	}
	if le.s.lost() {
		return le.s.lostErr("etcd session lost")
	}
	return nil
}

// verify checks a read of the lease's key.
func (le *lease) verify(resp *clientv3.GetResponse) error {
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != le.rev || resp.Kvs[0].Lease != int64(le.s.id) {
		return fmt.Errorf("%w: key gone", driver.ErrNotHeld)
	}
	return nil
}

// Release deletes the key. Its name is this acquisition's (the session's
// etcd lease id and a sequence number of the Locker), and is put again, by
// a later acquisition of the session, only once this delete was answered
// and deleted it (see session.release), so a retried or stale release never
// deletes another holder's key: a plain delete, which etcd serves faster
// than a compare-and-delete transaction, is enough, and what it deleted
// tells whether the key was still there.
//
// A delete that gets no answer (a leader election, a partition) is sent
// again, each attempt bounded by a second at most, until ctx ends or the
// request timeout has passed: the delete is conditional, so repeating it is
// safe, and an election is over in a second or two. Once an attempt's outcome was unknown, a later attempt
// that finds the key gone while the session lives counts as released: the
// key is this lease's alone, and only its own delete (or an operator's
// forced release) removes it under a live session.
//
// A lease released before, or taken by a forced release, is not sent
// anything either: its key may be another holder's by now. Release
// returns ErrNotHeld.
//
// A lease whose session has ended (lost, given up, or closed with the
// Locker) is not sent anything: the loss is already known, the session's
// lease is revoked or expiring with every key on it, and its connections may
// be closed. Release then returns ErrNotHeld at once.
//
// When no attempt is answered before ctx ends, the key may still be there,
// and the session's keepalive would keep it, and the lock, forever. The
// session is given up instead: its keepalive stops, its lease is revoked
// (again and again until etcd answers), and the key goes with it. The
// session's other locks are lost with it; later acquisitions start a new
// session.
func (le *lease) Release(ctx context.Context) error {
	if !le.s.forget(le) {
		// Released already, its key perhaps put again since by another
		// holder of the session, or taken by a forced release.
		return fmt.Errorf("%w: etcd lock released already or taken", driver.ErrNotHeld)
	}
	if le.s.lost() {
		return le.s.lostErr("etcd session lost before release")
	}
	own := le.key()
	// The attempts together get one request timeout, within the caller's.
	var (
		resp    *clientv3.DeleteResponse
		unknown bool
	)
	err := le.s.l.members.repeat(ctx, le.s.timeout, false, func(actx context.Context, c *clientv3.Client) error {
		var err error
		resp, err = c.Delete(actx, own)
		unknown = unknown || err != nil
		return err
	})
	switch {
	case err != nil:
		le.s.giveUp()
		return err
	case resp.Deleted > 0:
		if !unknown {
			le.s.release(le, own)
		}
		return nil
	case unknown && !le.s.lost():
		return nil // an earlier attempt deleted it
	case unknown:
		// The session ended while the release went unanswered (an
		// election outlasting the session's TTL): the key went with an
		// earlier attempt or with the session, either way after the
		// section, which ended while the session lived. That is no loss,
		// but a release nobody confirmed; guard judges by its clock
		// whether the section outlived the lease.
		return fmt.Errorf("%w: etcd session ended while the release went unanswered", driver.ErrUnavailable)
	default:
		return fmt.Errorf("%w: key gone before release", driver.ErrNotHeld)
	}
}

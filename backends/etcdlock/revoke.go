package etcdlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

// RevokedPrefix is the etcd key prefix under which ForceRelease tells a
// holder's session that its key was taken: <RevokedPrefix><session's lease
// id in hex>/<the contender key>. The marker is attached to the holder's own
// etcd lease, so it never outlives that session, and the session deletes it
// once it has seen it. An escaped lock name cannot contain '/', so no lock
// directory (KeyDir) lies under it, and List skips it; with etcd's
// authentication on, the users of a Locker need read and write access to it.
// A session whose watch of it etcd refuses is given up, whether the refusal
// comes at its start or later (the user's rights withdrawn, and the watch
// made again on another member): its Done channel closes, its keys go with
// its etcd lease, and its acquisition, or the next one, fails with etcd's
// refusal, since its holders could never hear of a forced release.
const RevokedPrefix = "warden/revoked/"

// errMarkersRefused is the error of a session whose watch of its
// revocation markers etcd refused for want of rights.
var errMarkersRefused = fmt.Errorf("%w: etcd refused to watch %s, where a forced release tells holders so (the user needs read and write access to it): %w",
	driver.ErrUnavailable, RevokedPrefix, rpctypes.ErrPermissionDenied)

var _ driver.RevocableLease = (*lease)(nil)

// revokedDir is the directory of the markers of the session whose etcd lease
// is id.
func revokedDir(id clientv3.LeaseID) string {
	return RevokedPrefix + strconv.FormatInt(int64(id), 16) + "/"
}

// maxIdle bounds the keys a session keeps to put again (see track): a
// process that locks ever new names (one per request, say) would otherwise
// keep a key per name it ever released.
const maxIdle = 256

// track returns the lease of a new contender for the lock name, and its
// key, under dir (the lock's KeyDir, or its readers' subdirectory when
// reader is set), registered so that a marker naming its key finds it. Its
// key is the session's key of an earlier contender there that was released
// cleanly (see release), or a new one.
//
// etcd keeps a deleted key in its index until the cluster is compacted
// (which etcd does not do by default), and every read of a range visits each
// key the range held since: with a key of its own per acquisition, the read
// that comes with every acquisition would slow down with every acquisition
// of that lock since the last compaction. A session that takes a lock again
// and again thus puts one key again and again.
func (s *session) track(name, dir string, reader bool) (*lease, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.idle[dir]
	if ok {
		delete(s.idle, dir)
	} else {
		seq = s.l.seq.Add(1)
	}
	le := &lease{s: s, name: name, seq: seq}
	if reader {
		le.seq |= readerSeq
	}
	s.link(le)
	return le, contenderKey(dir, s.id, seq)
}

// link puts le first on the session's list; s.mu is held.
func (s *session) link(le *lease) {
	le.next = s.tracked
	if s.tracked != nil {
		s.tracked.prev = le
	}
	s.tracked = le
}

// unlink takes le off the session's list, if it is on it; s.mu is held.
func (s *session) unlink(le *lease) {
	if !s.isTracked(le) {
		return
	}
	if le.prev != nil {
		le.prev.next = le.next
	} else {
		s.tracked = le.next
	}
	if le.next != nil {
		le.next.prev = le.prev
	}
	le.prev, le.next = nil, nil
}

// isTracked reports whether le is on the session's list; s.mu is held.
func (s *session) isTracked(le *lease) bool { return le.prev != nil || s.tracked == le }

// release marks own, le's key, as free to be put again by a later
// contender of the session. Release calls it only once its one delete of
// the key was answered and deleted it: no other delete of the key is then
// in flight (an acquisition that gave up, or a release that needed a
// second attempt, leaves its key unused ever after), so none can land on
// the next holder's; and no forced release took the key, whose marker
// would be taken for the next holder's. Put again, the key gets a new
// create revision, the next holder's token.
func (s *session) release(le *lease, own string) {
	dir := own[:strings.LastIndexByte(own, '/')+1]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.idle[dir]; ok {
		return
	}
	if len(s.idle) >= maxIdle {
		for d := range s.idle {
			delete(s.idle, d)
			break
		}
	}
	s.idle[dir] = le.number()
}

// forget drops le: it was released, or never granted. A revocation found
// later is not reported. It reports whether le was still tracked, that
// is neither forgotten before nor revoked.
func (s *session) forget(le *lease) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	tracked := s.isTracked(le)
	s.unlink(le)
	le.onRevoke = nil
	return tracked
}

// OnRevoke implements driver.RevocableLease. A forced release (ForceRelease)
// leaves a marker that the session's watch receives; f is called on the
// watch's goroutine, or at once when the marker has already been seen.
//
// A watch on a frozen member (a stopped process, a stalled disk) neither
// delivers nor fails, so a revocation may then be reported only once the
// Locker has moved to another member (its keepalive finds the member
// silent within a third of the TTL and a probe) and the watch with it, or
// never if the session ends first. The forced
// release itself does not wait for it: the storage's fencing is what refuses
// the old holder's writes meanwhile.
func (le *lease) OnRevoke(f func()) {
	s := le.s
	s.mu.Lock()
	switch {
	case le.next == le: // revoked
	case s.isTracked(le) && !s.lost():
		le.onRevoke = f
		f = nil
	default:
		f = nil // released, never granted or its session lost: nothing to report
	}
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// revoked reports the forced release of the contender key own. Markers
// are rare (an operator's ForceRelease), so the session's leases are
// searched for own's sequence number, and only a lease with that number has
// its key built to compare.
func (s *session) revoked(own string) {
	seq, err := strconv.ParseUint(own[strings.LastIndexByte(own, '-')+1:], 16, 64)
	if err != nil {
		return // no key of this Locker's
	}
	s.mu.Lock()
	var f func()
	for le := s.tracked; le != nil; le = le.next {
		if le.number() == seq && le.key() == own {
			s.unlink(le)
			le.next = le // revoked
			f, le.onRevoke = le.onRevoke, nil
			break
		}
	}
	s.mu.Unlock()
	if f != nil && !s.lost() {
		f()
	}
}

// watchRevocations watches the session's marker directory until the
// session ends, reporting each marker once it appears and then deleting it.
// A watch that fails (a member that loses its leader cancels it, since it
// is required) is created again; each new watch is followed by a read of
// the directory, so that a marker put while no watch ran is not missed. A
// watch refused for want of rights gives the session up instead, at its
// start (newSession then fails with the refusal) as later (the user's
// rights withdrawn, and the watch made again on another member): a
// session left unwatched would keep locks that an operator's forced
// release gave to others, its holders never told.
func (s *session) watchRevocations() {
	dir := revokedDir(s.id)
	for {
		err := s.watchRevocationsOnce(dir)
		if err == errMarkersRefused {
			s.mu.Lock()
			s.refusal = err
			s.mu.Unlock()
			s.giveUp()
			return
		}
		if driver.Sleep(s.kctx, retryDelay, s.done) != nil || s.lost() {
			return
		}
	}
}

// watchRefusal returns the refusal that gave the session up, if etcd refused
// the watch of its markers; nil otherwise.
func (s *session) watchRefusal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusal
}

// watchStarted waits until the session's first watch of its markers is
// created or refused, and returns its refusal for want of rights
// (errMarkersRefused): the session's holders could never be told of a
// forced release. Any other failure is retried by the watch itself, and
// ctx ending, the session ending (for another cause) or the bound passing
// end the wait with nil. A watch still unconfirmed after probeAfter has
// its member probed, as an unanswered request does: a member that froze
// after answering the grant confirms nothing, and the watch moves with the
// Locker to the next one.
func (s *session) watchStarted(ctx context.Context) error {
	t := time.NewTimer(time.Duration(s.timeout))
	defer t.Stop()
	probe := time.NewTimer(probeAfter)
	defer probe.Stop()
	for {
		select {
		case err := <-s.watching:
			if err == errMarkersRefused {
				return err
			}
			return nil
		case <-probe.C:
			s.l.members.probe(s.l.members.pick())
		case <-ctx.Done():
			return nil
		case <-s.done:
			return s.watchRefusal()
		case <-t.C:
			return nil
		}
	}
}

// watchRevocationsOnce runs one watch of the marker directory dir, on the
// member the Locker sends its requests to, until it fails, that member is
// no longer the one, or the session ends. It returns the watch's error, if
// it failed. Each watch's first outcome, its creation (nil) or its
// failure, is offered to s.watching, for watchStarted.
func (s *session) watchRevocationsOnce(dir string) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.kctx))
	defer cancel()
	moved := s.l.members.changes()
	created := startWatch(ctx, s.l.members.pick().client, dir, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
	var wch clientv3.WatchChan
	for {
		select {
		case <-s.done:
			return nil
		case <-moved:
			return nil
		case wch = <-created:
			created = nil
		case wr, ok := <-wch:
			if !ok {
				return nil
			}
			err := wr.Err()
			// clientv3 keeps a refusal of one watch as the error of its
			// whole stream, and hands it to the stream's other watches
			// that the server closes later; but etcd closes a watch only
			// at its creation, in answer to the client's cancel of a
			// watch whose context ended (which is not handed it), or at
			// a compaction (reported first as such). A refusal seen here
			// is this watch's own: its creation's, or its re-creation's
			// when clientv3 resumed it on a new stream.
			if denied(err) {
				err = errMarkersRefused
			}
			select {
			case s.watching <- err:
			default:
			}
			if err != nil {
				return err
			}
			var keys []string
			if wr.Created {
				var resp *clientv3.GetResponse
				err := s.l.members.do(ctx, s.timeout, false, func(rctx context.Context, c *clientv3.Client) error {
					var err error
					resp, err = c.Get(rctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
					return err
				})
				if err != nil {
					return err
				}
				for _, kv := range resp.Kvs {
					keys = append(keys, string(kv.Key))
				}
			}
			for _, ev := range wr.Events {
				keys = append(keys, string(ev.Kv.Key))
			}
			for _, k := range keys {
				s.revoked(strings.TrimPrefix(k, dir))
				// Best effort: the marker goes with the session's lease
				// anyway.
				s.l.members.do(ctx, s.timeout, false, func(rctx context.Context, c *clientv3.Client) error {
					_, err := c.Delete(rctx, k)
					return err
				})
			}
		}
	}
}

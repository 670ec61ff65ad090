package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

// session is one etcd lease shared by every key a Locker holds with one TTL,
// kept alive on a single keepalive stream. It is the driver.Session of all
// those keys' leases.
type session struct {
	l       *Locker // whose session it is
	timeout bound
	id      clientv3.LeaseID
	ttl     time.Duration

	// born is the send time of the grant; expiry is the session's Expiry as
	// nanoseconds after it, so that Expiry keeps born's monotonic reading
	// and guard can read it while the keepalive moves it. Zero once lost.
	born   time.Time
	expiry atomic.Int64

	kctx context.Context // the keepalive's; cancelled when the session is given up or closed
	stop context.CancelFunc
	// revoke asks the keepalive's exit to revoke the lease.
	revoke atomic.Bool
	// revokeErr is the exit's revocation error; read after exited.
	revokeErr error

	// mu guards tracked, the list and revocation state of each lease on
	// it, and refusal.
	mu sync.Mutex
	// tracked is the first of the session's contenders, on a list through
	// their leases, from before their key is put until they are released,
	// abandoned or revoked: a forced release's marker names the key, and
	// may arrive before the acquisition returns.
	tracked *lease
	// idle are the sequence numbers of the keys the session may put again,
	// by directory (see track).
	idle map[string]uint64
	// refusal is errMarkersRefused once etcd refused the watch of the
	// session's revocation markers, which gave the session up.
	refusal error

	// watching is offered the first outcome of each watch of the
	// session's revocation markers; watchStarted takes the first.
	watching chan error

	// done is closed when the lease is lost, revoked or given up.
	done   chan struct{}
	exited chan struct{}
	// wg counts the keepalive stream readers and the revocation watch, so
	// that close returns only when nothing of the session runs any more.
	wg sync.WaitGroup
}

var _ driver.Session = (*session)(nil)

// retryDelay spaces attempts to reopen a broken keepalive stream. The loss
// deadline, not the number of attempts, decides when to give up.
const retryDelay = 100 * time.Millisecond

// newSession grants a lease of ttl and starts keeping it alive, and
// watching its revocation markers: a session whose watch etcd refuses for
// want of rights is revoked, and its acquisition fails with etcd's
// reason, rather than hold locks whose forced release it would never hear
// of (see watchRevocations).
func newSession(ctx context.Context, l *Locker, ttl time.Duration) (*session, error) {
	timeout := l.timeout
	var (
		sent time.Time
		resp *clientv3.LeaseGrantResponse
	)
	// A grant whose attempt timed out but that lands after all leaves a
	// lease without keys, which expires on its own.
	err := l.members.repeat(ctx, timeout, false, func(actx context.Context, c *clientv3.Client) error {
		sent = time.Now()
		var err error
		resp, err = c.Grant(actx, ttlSeconds(ttl))
		return err
	})
	if err != nil {
		return nil, err
	}
	kctx, stop := context.WithCancel(context.Background())
	s := &session{
		l:        l,
		timeout:  timeout,
		id:       resp.ID,
		ttl:      ttl,
		born:     sent,
		kctx:     kctx,
		stop:     stop,
		idle:     make(map[string]uint64),
		watching: make(chan error, 1),
		done:     make(chan struct{}),
		exited:   make(chan struct{}),
	}
	// The server started counting no earlier than the request was sent, and
	// may have raised the TTL to its minimum, never lowered it.
	s.expiry.Store(int64(time.Duration(resp.TTL) * time.Second))
	go s.run()
	s.wg.Go(s.watchRevocations)
	if err := s.watchStarted(ctx); err != nil {
		s.close(true)
		return nil, err
	}
	return s, nil
}

// Expiry implements driver.Session: the send time of the last answered
// keepalive (or of the grant) plus the lease's TTL; born, in the past, once
// the session is lost.
func (s *session) Expiry() time.Time { return s.born.Add(time.Duration(s.expiry.Load())) }

// Done implements driver.Session.
func (s *session) Done() <-chan struct{} { return s.done }

// lost reports whether the session has ended or is ending: one given up
// must take no new key even before its keepalive has noticed.
func (s *session) lost() bool {
	if s.kctx.Err() != nil {
		return true
	}
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// lostErr is the error of a request on a lease of the session once it has
// ended: ErrNotHeld, saying what (and giving etcd's refusal when it was
// given up because etcd refused the watch of its markers).
func (s *session) lostErr(what string) error {
	if err := s.watchRefusal(); err != nil {
		return fmt.Errorf("%w: %s: %v", driver.ErrNotHeld, what, err)
	}
	return fmt.Errorf("%w: %s", driver.ErrNotHeld, what)
}

// margin is how long before the earliest possible server-side expiry the
// session declares itself lost: room for the two clocks running at slightly
// different rates and for this process being descheduled.
func (s *session) margin() time.Duration { return s.ttl / 10 }

// run keeps the lease alive until it is lost or stopped, then closes done
// and only then revokes the lease when asked to: whoever watches done learns
// of the loss before the server can hand the locks to anyone else.
func (s *session) run() {
	defer close(s.exited)
	unanswered := s.keepAlive(s.kctx)
	expiry := s.Expiry()
	s.expiry.Store(0)
	close(s.done)
	if unanswered || s.revoke.Load() {
		s.spareHolders(expiry)
		s.revokeErr = s.revokeUntilGone()
	}
}

// spareHolders waits, when the session still holds locks, for the margin
// (and never past expiry, when the server would have expired the lease
// anyway) before the lease is revoked. Their sections were told of the loss
// when done closed; a lease that runs out leaves them the margin to stop
// before the locks can go to anyone else, and a revocation sent at once
// would leave them a round trip. Closing the Locker, which releases every
// lock it holds on purpose, does not wait.
func (s *session) spareHolders(expiry time.Time) {
	s.mu.Lock()
	holding := false
	for le := s.tracked; le != nil && !holding; le = le.next {
		holding = le.rev != 0
	}
	s.mu.Unlock()
	d := min(time.Until(expiry), s.margin())
	if !holding || d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.l.quit:
	case <-t.C:
	}
}

// revokeUntilGone revokes the lease, again and again while etcd cannot be
// reached, until it is gone or the Locker is closed. Giving up after one
// attempt is not enough: a lease outlives an outage, since etcd restarts
// every lease's TTL when a new leader is elected, so the keys of a session
// this process already knows lost would block their locks for a whole TTL
// after etcd comes back. Once the client is closed, nothing can be sent:
// it gives up then too.
func (s *session) revokeUntilGone() error {
	pause := driver.Backoff{Min: retryDelay, Max: 500 * time.Millisecond}
	for {
		if s.l.client.Ctx().Err() != nil {
			return errClientClosed
		}
		err := s.revokeLease()
		if err == nil || !errors.Is(err, driver.ErrUnavailable) {
			return err
		}
		t := time.NewTimer(pause.Next())
		select {
		case <-s.l.quit:
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// errClientClosed is the revocation's error once the client is closed.
var errClientClosed = fmt.Errorf("%w: etcd client closed", driver.ErrUnavailable)

// revokeLease revokes the lease, so that its keys disappear at once instead
// of at its expiry.
func (s *session) revokeLease() error {
	err := s.l.members.repeat(context.Background(), s.timeout, false, func(actx context.Context, c *clientv3.Client) error {
		_, err := c.Revoke(actx, s.id)
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

type keepAliveResult struct {
	resp *pb.LeaseKeepAliveResponse
	err  error
}

// keepAliveStream is one LeaseKeepAlive stream and the goroutine that opens
// and then reads it.
//
// Opening is the goroutine's, not the keepalive loop's: it can wait for as
// long as gRPC takes to connect (20 s by default) to a member whose process
// is frozen, since the kernel still accepts the connection and nobody
// answers its handshake. A member the Locker had not used yet, pinned when
// the one before it knew no leader during an election, is such a member.
// The loop waiting with it would neither declare the session lost at its
// deadline nor follow the Locker when the member's probe moves it elsewhere,
// and every waiter behind the session's keys would wait for their lease to
// run out on the server.
type keepAliveStream struct {
	member *member // the stream's
	cancel context.CancelFunc
	// opened delivers the outcome of opening the stream, once; stream is
	// set before it delivers nil.
	opened chan error
	open   bool // opened has delivered nil; the loop's alone
	stream pb.Lease_LeaseKeepAliveClient
	resps  chan keepAliveResult
}

// openStream starts opening a keepalive stream on the pinned member.
func (s *session) openStream(ctx context.Context) *keepAliveStream {
	// Require a leader, as client/v3 does for its own keepalives: a member cut
	// off from the quorum must fail the stream rather than answer for a lease
	// the rest of the cluster may already have expired.
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	ks := &keepAliveStream{member: s.l.members.pick(), cancel: cancel, opened: make(chan error, 1), resps: make(chan keepAliveResult)}
	s.wg.Go(func() {
		stream, err := pb.NewLeaseClient(ks.member.conn).LeaseKeepAlive(sctx)
		if err != nil {
			ks.opened <- err
			return
		}
		ks.stream = stream
		ks.opened <- nil
		for {
			resp, err := stream.Recv()
			select {
			case ks.resps <- keepAliveResult{resp, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	})
	return ks
}

// keepAlive renews the lease every ttl/3 with one request at a time on one
// stream, until ctx is done or the lease can no longer be known to be alive;
// it reports the latter case when the server may still hold the lease
// (it did not answer in time), so that run revokes it in case it hears after
// all.
func (s *session) keepAlive(ctx context.Context) (unanswered bool) {
	var (
		st          *keepAliveStream
		sentAt      time.Time
		outstanding bool
		// probe probes the stream's member when the keepalive in
		// flight goes unanswered, or the stream unopened, for
		// probeAfter.
		probe *time.Timer
	)
	answered := func() {
		outstanding = false
		if probe != nil {
			probe.Stop()
		}
	}
	drop := func() {
		if st != nil {
			st.cancel()
			st = nil
		}
		answered()
	}
	defer drop()

	interval := s.ttl / 3
	lostTimer := time.NewTimer(time.Until(s.Expiry()) - s.margin())
	defer lostTimer.Stop()
	tick := time.NewTimer(interval)
	defer tick.Stop()
	// failed drops a stream that failed with err, and has its member probed
	// when the failure says that member cannot be reached.
	failed := func(err error) {
		if unreachable(err) {
			s.l.members.probe(st.member)
		}
		drop()
		tick.Reset(retryDelay)
	}
	// watchOver has st's member probed unless answered (opened, or the
	// keepalive answered) within probeAfter.
	watchOver := func() {
		m := st.member
		probe = time.AfterFunc(probeAfter, func() { s.l.members.probe(m) })
	}
	send := func() {
		sentAt = time.Now()
		if err := st.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(s.id)}); err != nil {
			failed(err)
			return
		}
		outstanding = true
		watchOver()
		tick.Reset(interval)
	}

	for {
		var (
			opened chan error
			resps  chan keepAliveResult
		)
		switch {
		case st == nil:
		case st.open:
			resps = st.resps
		default:
			opened = st.opened
		}
		select {
		case <-ctx.Done():
			return false
		case <-lostTimer.C:
			return true
		case <-s.l.client.Ctx().Done():
			// Closed: nothing renews the lease any more, and its
			// holders are told now rather than at the loss deadline.
			return true
		case <-s.l.members.changes():
			// Requests have moved to another member, the one this
			// stream is on, or being opened on, having stopped
			// answering: renew there now rather than after this
			// stream's keepalive times out.
			if st != nil && st.member != s.l.members.pick() {
				drop()
				tick.Reset(0)
			}
		case err := <-opened:
			answered()
			if err != nil {
				failed(err)
				continue
			}
			st.open = true
			send()
		case <-tick.C:
			if outstanding || (st != nil && !st.open) {
				// A whole interval without an answer, or without the
				// stream opening: it is stuck (a half-open connection, a
				// handshake nobody answers); start over on a new one.
				drop()
			}
			if st == nil {
				st = s.openStream(ctx)
				watchOver()
				tick.Reset(interval)
				continue // the keepalive goes once the stream is open
			}
			send()
		case r := <-resps:
			if r.err != nil {
				failed(r.err)
				continue
			}
			if !outstanding {
				continue
			}
			answered()
			if r.resp.TTL <= 0 {
				return false // the server no longer knows the lease: expired or revoked
			}
			s.expiry.Store(int64(sentAt.Sub(s.born) + time.Duration(r.resp.TTL)*time.Second))
			lostTimer.Reset(time.Until(s.Expiry()) - s.margin())
			tick.Reset(time.Until(sentAt.Add(interval)))
		}
	}
}

// giveUp ends the session because one of its keys may be left behind: a
// delete or a put whose outcome is unknown. Its keepalive stops at once, so
// that no such key can outlive the lease's TTL; the lease is revoked, best
// effort, after done is closed (and the margin has passed, when it holds
// locks: see spareHolders). Every other lease of the session is lost
// with it; the Locker starts a new session for later acquisitions.
func (s *session) giveUp() {
	s.revoke.Store(true)
	s.stop()
}

// close stops the keepalive and, when revoke is set, revokes the lease so its
// keys disappear at once. It returns when nothing of the session runs any
// more.
func (s *session) close(revoke bool) error {
	// A lost session has already tried to revoke its lease, or the server
	// no longer has it.
	revoke = revoke && !s.lost()
	if revoke {
		s.revoke.Store(true)
	}
	s.stop()
	<-s.exited
	s.wg.Wait()
	if !revoke {
		return nil
	}
	return s.revokeErr
}

// exitedYet reports whether nothing of the session runs any more.
func (s *session) exitedYet() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

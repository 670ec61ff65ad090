package consullock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// session is one Consul session shared by every lock a Locker holds with
// one TTL, renewed by one request per period. It is the driver.Session of
// all those locks' leases.
type session struct {
	l   *Locker
	id  string
	ttl time.Duration

	// born is the send time of the creation; expiry is the session's
	// Expiry as nanoseconds after it, so that Expiry keeps born's monotonic
	// reading. Zero once lost.
	born   time.Time
	expiry atomic.Int64
	// anchored: newSession acquired the anchor (see watchRevocations).
	anchored bool

	ctx  context.Context // cancelled when the session is given up or closed
	stop context.CancelFunc
	// destroy asks the renewal's exit to destroy the session.
	destroy    atomic.Bool
	destroyErr error // read after exited

	// mu guards leases, acquiring, revoked and closing, and the revocation
	// state of each lease.
	mu sync.Mutex
	// leases are the session's granted leases by lock key.
	leases map[string]*lease
	// acquiring numbers the session's acquisitions under way by key, from
	// seq: one may hold the key before it is granted (see pending).
	acquiring map[string][]uint64
	seq       uint64
	// revoked are forced releases seen for keys with acquisitions under
	// way (see revoke), kept until the last of those ends.
	revoked map[revocation]bool
	// closing is set by close, which then waits for wg: nothing joins wg
	// after it.
	closing bool

	// renewNow asks for a renewal before the next period: the session
	// may be gone.
	renewNow chan struct{}

	done   chan struct{} // closed when the session is lost, given up or closed
	exited chan struct{} // closed when the renewal has stopped
	wg     sync.WaitGroup
}

var _ driver.Session = (*session)(nil)

// retryDelay spaces the attempts of a renewal or a watch that failed. The
// loss deadline, not the number of attempts, decides when to give up.
const retryDelay = 200 * time.Millisecond

// newSession creates a session of ttl, acquires its anchor (see
// watchRevocations) and starts renewing it. A session whose anchor is
// refused, as by an ACL token without write on RevokedPrefix, is destroyed
// and its error returned: its holders would not learn that ForceRelease
// took their locks. A Store's session, which holds no locks, lives on
// without its anchor instead when it is refused (Locker.anchorOptional);
// any other failure fails the session as it fails a Locker's, rather than
// leave it unanchored for its life. Its first renewal
// is due a third of the TTL after the creation was sent, however long
// the anchor took.
//
// The request is sent raw because the client's Session().Create leaves out
// a zero LockDelay (the server then applies its 15 s default) and empty
// check lists (the server then adds serfHealth); see the package
// documentation for why neither is wanted.
func newSession(ctx context.Context, l *Locker, ttl time.Duration) (*session, error) {
	body := map[string]any{
		"Name":          "warden",
		"TTL":           ttl.String(),
		"Behavior":      "delete",
		"LockDelay":     "0s",
		"NodeChecks":    []string{},
		"ServiceChecks": []any{},
	}
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	var out struct{ ID string }
	born := time.Now()
	if _, err := l.client.Raw().Write("/v1/session/create", body, &out, writeOpts(rctx)); err != nil {
		return nil, l.fail(ctx, rctx, err)
	}
	if out.ID == "" {
		return nil, fmt.Errorf("%w: consul: session created without an id", driver.ErrUnavailable)
	}
	s := &session{
		l: l, id: out.ID, ttl: ttl, born: born,
		leases:    make(map[string]*lease),
		acquiring: make(map[string][]uint64),
		revoked:   make(map[revocation]bool),
		renewNow:  make(chan struct{}, 1),
		done:      make(chan struct{}),
		exited:    make(chan struct{}),
	}
	err := s.anchor(ctx)
	s.anchored = err == nil
	if err != nil && !(l.anchorOptional && errors.Is(err, errDenied)) {
		// It holds nothing yet: destroyed, best effort and within ctx,
		// rather than left to expire.
		rctx, cancel := l.rctx(ctx)
		_, _ = l.client.Session().Destroy(s.id, writeOpts(rctx))
		cancel()
		return nil, err
	}
	s.expiry.Store(int64(ttl))
	s.ctx, s.stop = context.WithCancel(context.Background())
	go s.run()
	s.wg.Go(s.watchRevocations)
	return s, nil
}

// Expiry implements driver.Session: the send time of the last answered
// renewal (or of the creation) plus the TTL. Consul may keep the session up
// to twice as long, never less. It is in the past once the session is lost.
func (s *session) Expiry() time.Time { return s.born.Add(time.Duration(s.expiry.Load())) }

// Done implements driver.Session.
func (s *session) Done() <-chan struct{} { return s.done }

// lost reports whether the session has ended or is ending.
func (s *session) lost() bool {
	if s.ctx.Err() != nil {
		return true
	}
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// margin is how long before the earliest possible server-side expiry the
// session declares itself lost: room for clock rates and descheduling.
func (s *session) margin() time.Duration { return s.ttl / 10 }

// run renews the session until it is lost or stopped, then closes done and
// only then destroys the session when asked to (or when the server may
// still have it: see renew), so that whoever watches done
// learns of the loss before the server can grant the locks to anyone else.
func (s *session) run() {
	defer close(s.exited)
	mayLive := s.renew()
	s.expiry.Store(0)
	close(s.done)
	if mayLive || s.destroy.Load() {
		s.destroyErr = s.destroyUntilGone()
	}
}

// renew renews the session every third of its TTL, one request at a time,
// until the session is stopped, the server no longer knows it, or no
// renewal has been answered by a margin before its Expiry; it reports
// whether the server may still have the session: in the last two cases.
// A server that says it does not know the session may be one restarted
// and still restoring its state, which it will have once restored: the
// session, and the keys it holds, would then stay until its TTL ran out.
func (s *session) renew() (mayLive bool) {
	interval := s.ttl / 3
	// Due from the creation, which the Expiry counts from, not from when
	// newSession was done with the anchor.
	next := time.NewTimer(time.Until(s.born.Add(interval)))
	defer next.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return false
		case <-next.C:
		case <-s.renewNow:
		}
		deadline := s.Expiry().Add(-s.margin())
		if !time.Now().Before(deadline) {
			return true
		}
		rctx, cancel := context.WithDeadline(s.ctx, deadline)
		rctx, cancel2 := s.l.rctx(rctx)
		sent := time.Now()
		entry, _, err := s.l.client.Session().Renew(s.id, writeOpts(rctx))
		cancel2()
		cancel()
		switch {
		case s.ctx.Err() != nil:
			return false
		case err != nil:
			next.Reset(retryDelay)
			continue
		case entry == nil:
			return true // expired or destroyed, or not restored yet
		}
		ttl := s.ttl
		if d, err := time.ParseDuration(entry.TTL); err == nil && d > 0 && d < ttl {
			ttl = d
		}
		s.expiry.Store(int64(sent.Sub(s.born) + ttl))
		next.Reset(time.Until(sent.Add(interval)))
	}
}

// destroyUntilGone destroys the session, again while Consul cannot be
// reached, until it is gone, Consul refuses the destruction (errRefused: a
// token deleted or stripped of its rights would be refused again, and the
// session expires by its TTL, which nothing renews any more) or the Locker
// is closed: the server would otherwise keep its keys, and its locks,
// until its TTL runs out. The attempts are as close as a release's resends
// (resendPause), so that the locks come back soon after a new leader
// serves.
func (s *session) destroyUntilGone() error {
	pause := driver.Backoff{Min: resendPause / 4, Max: resendPause}
	for {
		rctx, cancel := s.l.rctx(context.Background())
		_, err := s.l.client.Session().Destroy(s.id, writeOpts(rctx))
		err = s.l.fail(context.Background(), rctx, err)
		cancel()
		if err == nil || !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, errRefused) {
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

// giveUp ends the session because one of its keys may be left behind (a
// write whose outcome is unknown): its renewal stops, and it is destroyed,
// with every key it holds, after done is closed. Its other leases are lost
// with it; the Locker creates a new session for later acquisitions.
func (s *session) giveUp() {
	s.destroy.Store(true)
	s.stop()
}

// close stops the renewal and, when destroy is set, destroys the session so
// its keys disappear at once. It returns when nothing of the session runs
// any more.
func (s *session) close(destroy bool) error {
	destroy = destroy && !s.lost()
	if destroy {
		s.destroy.Store(true)
	}
	s.stop()
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	<-s.exited
	s.wg.Wait()
	if !destroy {
		return nil
	}
	return s.destroyErr
}

// spawn runs f on a goroutine of the session's, which close waits for,
// unless the session is closing; it reports whether it did.
func (s *session) spawn(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Go(f)
	return true
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

// whileAlive returns a context cancelled when ctx is or the session ends,
// for blocking queries, which wait on purpose and would otherwise outlive
// the session.
func (s *session) whileAlive(ctx context.Context) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-wctx.Done():
		}
	}()
	return wctx, func() { stop(); cancel() }
}

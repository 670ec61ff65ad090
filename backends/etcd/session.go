package etcd

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// session is one etcd lease shared by every key a Locker holds with one TTL,
// kept alive on a single keepalive stream.
type session struct {
	client *clientv3.Client
	id     clientv3.LeaseID
	ttl    time.Duration

	// done is closed when the lease is lost, revoked or abandoned.
	done   chan struct{}
	stop   context.CancelFunc
	exited chan struct{}
	// wg counts the keepalive stream readers, so that close returns only
	// when nothing of the session runs any more.
	wg sync.WaitGroup
}

// retryDelay spaces attempts to reopen a broken keepalive stream. The lost
// deadline, not the number of attempts, decides when to give up.
const retryDelay = 100 * time.Millisecond

// newSession grants a lease of ttl and starts keeping it alive.
func newSession(ctx context.Context, client *clientv3.Client, ttl time.Duration) (*session, error) {
	sent := time.Now()
	resp, err := client.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return nil, unavailable(ctx, err)
	}
	kctx, stop := context.WithCancel(context.Background())
	s := &session{
		client: client,
		id:     resp.ID,
		ttl:    ttl,
		done:   make(chan struct{}),
		stop:   stop,
		exited: make(chan struct{}),
	}
	// The server started counting no earlier than we sent the request.
	go s.keepAlive(kctx, sent.Add(time.Duration(resp.TTL)*time.Second))
	return s, nil
}

// lost reports whether the session has ended.
func (s *session) lost() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// margin is how long before the earliest possible server-side expiry the
// session declares itself lost: room for the two clocks running at slightly
// different rates and for this process being descheduled.
func (s *session) margin() time.Duration { return s.ttl / 10 }

type keepAliveResult struct {
	resp *pb.LeaseKeepAliveResponse
	err  error
}

// keepAliveStream is one LeaseKeepAlive stream and the goroutine reading it.
type keepAliveStream struct {
	stream pb.Lease_LeaseKeepAliveClient
	cancel context.CancelFunc
	resps  chan keepAliveResult
}

func (s *session) openStream(ctx context.Context) (*keepAliveStream, error) {
	// Require a leader, as client/v3 does for its own keepalives: a member cut
	// off from the quorum must fail the stream rather than answer for a lease
	// the rest of the cluster may already have expired.
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	stream, err := pb.NewLeaseClient(s.client.ActiveConnection()).LeaseKeepAlive(sctx)
	if err != nil {
		cancel()
		return nil, err
	}
	ks := &keepAliveStream{stream: stream, cancel: cancel, resps: make(chan keepAliveResult)}
	s.wg.Go(func() {
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
	return ks, nil
}

// keepAlive renews the lease every ttl/3 with one request at a time on one
// stream, and closes done when the lease can no longer be known to be alive.
// expiry is the earliest moment the server may expire the lease.
func (s *session) keepAlive(ctx context.Context, expiry time.Time) {
	defer close(s.exited)
	defer close(s.done)
	var (
		st          *keepAliveStream
		sentAt      time.Time
		outstanding bool
	)
	drop := func() {
		if st != nil {
			st.cancel()
			st = nil
		}
		outstanding = false
	}
	defer drop()

	interval := s.ttl / 3
	lostTimer := time.NewTimer(time.Until(expiry) - s.margin())
	defer lostTimer.Stop()
	tick := time.NewTimer(interval)
	defer tick.Stop()

	for {
		var resps chan keepAliveResult
		if st != nil {
			resps = st.resps
		}
		select {
		case <-ctx.Done():
			return
		case <-lostTimer.C:
			// Unreachable for too long. Revoke in case the server hears us
			// after all, so that others need not wait for the expiry.
			rctx, cancel := context.WithTimeout(context.Background(), s.margin())
			s.client.Revoke(rctx, s.id)
			cancel()
			return
		case <-tick.C:
			if outstanding {
				// A whole interval without an answer: the stream is stuck
				// (a half-open connection); start over on a new one.
				drop()
			}
			if st == nil {
				var err error
				if st, err = s.openStream(ctx); err != nil {
					tick.Reset(retryDelay)
					continue
				}
			}
			sentAt = time.Now()
			if err := st.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(s.id)}); err != nil {
				drop()
				tick.Reset(retryDelay)
				continue
			}
			outstanding = true
			tick.Reset(interval)
		case r := <-resps:
			if r.err != nil {
				drop()
				tick.Reset(retryDelay)
				continue
			}
			if !outstanding {
				continue
			}
			outstanding = false
			if r.resp.TTL <= 0 {
				return // the server no longer knows the lease: expired or revoked
			}
			expiry = sentAt.Add(time.Duration(r.resp.TTL) * time.Second)
			lostTimer.Reset(time.Until(expiry) - s.margin())
			tick.Reset(time.Until(sentAt.Add(interval)))
		}
	}
}

// abandon stops the keepalive without revoking: the lease, and every key on
// it, expires on the server within its TTL.
func (s *session) abandon() { s.stop() }

// close stops the keepalive and, when revoke is set, revokes the lease so its
// keys disappear at once.
func (s *session) close(ctx context.Context, revoke bool) error {
	// A lost session has already tried to revoke its lease; the server
	// will expire it otherwise.
	revoke = revoke && !s.lost()
	s.stop()
	<-s.exited
	s.wg.Wait()
	if !revoke {
		return nil
	}
	if _, err := s.client.Revoke(ctx, s.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return unavailable(ctx, err)
	}
	return nil
}

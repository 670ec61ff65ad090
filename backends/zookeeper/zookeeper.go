// Package zookeeper is a warden lock backend on Apache ZooKeeper, with the
// classic recipe: one persistent (container) parent per lock name, one
// EPHEMERAL_SEQUENTIAL child per contender, the lowest sequence holds, and
// every waiter watches only the node it queues behind, so a release wakes one
// client instead of a herd.
//
// # Layout
//
// Under the root (DefaultRoot unless WithRoot says otherwise) a lock on key k
// lives in the container node root/E(k) and a semaphore in root/E(k)~semaphore,
// where E percent-escapes every byte of k outside [A-Za-z0-9_:.-] (and a
// leading '.'), so that any key, including '/' and non-ASCII text, is one valid
// node name. Contender nodes are named _c_<guid>-<kind>-<sequence>: the GUID
// lets a create that was interrupted by a connection loss find its node again
// instead of leaving an orphan in the queue. Parents are container nodes, so
// the server removes them once empty; a contender that races the removal
// recreates the parent and retries, so removal never harms a live contender.
//
// # Leases live with the session
//
// A lease is an ephemeral node, so it lives exactly as long as the ZooKeeper
// session of the Locker that created it: the session timeout given to Dial
// (as negotiated with the server) is the lease TTL, and AcquireOptions.TTL is
// ignored. Lease.Refresh checks the node is still there and the session alive.
//
// # When a lease is lost
//
// The server expires a session once it has heard nothing from the client for
// the session timeout T. A request the server answered proves it heard from
// the client no earlier than the moment the request was sent, so the Locker
// keeps, by the local monotonic clock, the send time of the latest answered
// request (sending a cheap heartbeat every T/6 while it holds leases). Lease.Done
// is closed as soon as 2/3 T has passed since then without a newer answer,
// which is at least T/3 before the server can expire the session and grant
// the lock to anyone else; and at once when the session is reported expired or
// the Locker is closed. A lost lease stays lost even if the connection comes
// back: its owner must stop and Release it.
//
// Fencing tokens are the czxid of the contender's node: ZooKeeper's
// transaction ids grow across the whole ensemble, and the holders of a lock
// are granted in creation order.
package zookeeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard"
)

// DefaultRoot is the node under which locks live unless WithRoot is given.
const DefaultRoot = "/warden/locks"

// Option configures a Locker.
type Option func(*config)

type config struct {
	root   string
	acl    []zk.ACL
	logger zk.Logger
}

// WithRoot sets the persistent node under which lock nodes are created. It
// must be an absolute ZooKeeper path other than "/", without a trailing slash.
// It is created on first use.
func WithRoot(path string) Option { return func(c *config) { c.root = path } }

// WithACL sets the ACL of every node the Locker creates (default: world
// readable and writable, zk.WorldACL(zk.PermAll)).
func WithACL(acl ...zk.ACL) Option { return func(c *config) { c.acl = acl } }

// WithLogger sets where the ZooKeeper client logs connection errors (default
// zk.DefaultLogger, the standard log package).
func WithLogger(l zk.Logger) Option { return func(c *config) { c.logger = l } }

// Locker is a guard.Locker on one ZooKeeper session. It also offers read/write
// locks (guard.RWLocker) and semaphores (guard.Semaphorer). It is safe for
// concurrent use; each Locker is one session, so separate processes (or
// clients that must not share fate) need separate Lockers.
type Locker struct {
	conn    *zk.Conn
	root    string
	acl     []zk.ACL
	timeout time.Duration // as asked at Dial

	negotiated atomic.Int64 // session timeout the server granted, in ms; 0 until known
	requests   atomic.Int64 // requests sent for lock operations (heartbeats not counted)

	mu     sync.Mutex
	ep     *epoch // leases granted since the session was last known healthy
	closed bool
	bg     sync.WaitGroup // background cleanups and the monitor

	quit chan struct{}
}

// epoch groups the leases that share a fate: those granted on one session
// since the Locker last had to declare its leases lost.
type epoch struct {
	session int64
	done    chan struct{}
	// guarded by Locker.mu
	lastAck time.Time // send time of the latest request the server answered
	held    int
	lost    bool
}

// Dial connects to the ZooKeeper ensemble servers (host:port each) with the
// given session timeout, which is the TTL of every lease of this Locker (the
// server may adjust it to its minSessionTimeout..maxSessionTimeout range; the
// Locker follows what the server grants). Dial does not wait for the session:
// operations wait for it, or fail with guard.ErrUnavailable.
func Dial(servers []string, sessionTimeout time.Duration, opts ...Option) (*Locker, error) {
	cfg := config{root: DefaultRoot, acl: zk.WorldACL(zk.PermAll), logger: zk.DefaultLogger}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.root == "/" || !strings.HasPrefix(cfg.root, "/") || strings.HasSuffix(cfg.root, "/") {
		return nil, fmt.Errorf("%w: zookeeper root %q", guard.ErrInvalidOption, cfg.root)
	}
	if len(cfg.acl) == 0 {
		return nil, fmt.Errorf("%w: empty zookeeper ACL", guard.ErrInvalidOption)
	}
	if sessionTimeout <= 0 {
		return nil, fmt.Errorf("%w: zookeeper session timeout %v", guard.ErrInvalidOption, sessionTimeout)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w: no zookeeper servers", guard.ErrInvalidOption)
	}
	l := &Locker{root: cfg.root, acl: cfg.acl, timeout: sessionTimeout, quit: make(chan struct{})}
	conn, _, err := zk.Connect(servers, sessionTimeout,
		zk.WithDialer(l.dial),
		zk.WithEventCallback(l.onEvent),
		zk.WithLogger(cfg.logger),
		zk.WithLogInfo(false))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", guard.ErrUnavailable, err)
	}
	l.conn = conn
	l.bg.Add(1)
	go l.monitor()
	return l, nil
}

// Close ends the session: every lease of the Locker is released at once (the
// server deletes its ephemeral nodes) and their Done channels are closed.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	if l.ep != nil {
		l.loseLocked(l.ep)
	}
	l.mu.Unlock()
	close(l.quit)
	l.conn.Close()
	l.bg.Wait()
	return nil
}

// dial connects like net.DialTimeout and reads, from the connect response
// that starts every connection, the session timeout the server granted: the
// client library keeps it to itself, and the loss rule must use the server's
// figure, not the one asked for.
func (l *Locker) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c, granted: func(ms int32) {
		if ms > 0 {
			l.negotiated.Store(int64(ms))
		}
	}}, nil
}

// sniffConn watches the first 12 bytes a connection reads: the frame length,
// the protocol version and the negotiated timeout of the connect response.
type sniffConn struct {
	net.Conn
	head    []byte
	granted func(ms int32)
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if len(c.head) < 12 && n > 0 {
		c.head = append(c.head, p[:min(n, 12-len(c.head))]...)
		if len(c.head) == 12 {
			c.granted(int32(binary.BigEndian.Uint32(c.head[8:12])))
		}
	}
	return n, err
}

// sessionTimeout is the session timeout in force: the server's when known.
func (l *Locker) sessionTimeout() time.Duration {
	if ms := l.negotiated.Load(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return l.timeout
}

// onEvent runs on the client library's goroutine and must not block.
func (l *Locker) onEvent(ev zk.Event) {
	if ev.Type == zk.EventSession && ev.State == zk.StateExpired {
		l.mu.Lock()
		if l.ep != nil {
			l.loseLocked(l.ep)
		}
		l.mu.Unlock()
	}
}

func (l *Locker) loseLocked(ep *epoch) {
	if !ep.lost {
		ep.lost = true
		close(ep.done)
	}
}

// ack records that the server answered a request sent at sent while the
// session was sid: the server cannot expire that session before sent plus the
// session timeout.
func (l *Locker) ack(sent time.Time, sid int64) {
	if l.conn.SessionID() != sid {
		return
	}
	l.mu.Lock()
	if ep := l.ep; ep != nil && !ep.lost && ep.session == sid && sent.After(ep.lastAck) {
		ep.lastAck = sent
	}
	l.mu.Unlock()
}

// grantEpoch returns the epoch a lease on a node owned by session owner joins,
// the node's existence having been confirmed by a request sent at sent.
func (l *Locker) grantEpoch(owner int64, sent time.Time) (*epoch, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errClosed
	}
	ep := l.ep
	if ep != nil && !ep.lost && ep.session != owner {
		// A new session means the old one expired, and its nodes with it.
		l.loseLocked(ep)
	}
	if ep == nil || ep.lost || ep.session != owner {
		ep = &epoch{session: owner, done: make(chan struct{}), lastAck: sent}
		l.ep = ep
	}
	ep.held++
	return ep, nil
}

func (l *Locker) dropHeld(ep *epoch) {
	l.mu.Lock()
	ep.held--
	l.mu.Unlock()
}

// monitor declares the current epoch lost when the server may be about to
// expire its session, and sends heartbeats while leases are held so that an
// idle holder is not mistaken for a disconnected one.
func (l *Locker) monitor() {
	defer l.bg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	beat := make(chan struct{}, 1)
	beating := false
	for {
		select {
		case <-l.quit:
			if beating {
				<-beat
			}
			return
		case <-beat:
			beating = false
		case <-timer.C:
		}
		due, next := l.check(time.Now())
		if due && !beating {
			beating = true
			go func() {
				sent, sid := time.Now(), l.conn.SessionID()
				if _, _, err := l.conn.Exists(l.root); err == nil {
					l.ack(sent, sid)
				}
				beat <- struct{}{}
			}()
		}
		timer.Reset(next)
	}
}

// check applies the loss rule to the current epoch at now. It reports whether
// a heartbeat is due and how long the monitor may sleep.
func (l *Locker) check(now time.Time) (heartbeat bool, next time.Duration) {
	t := l.sessionTimeout()
	interval := max(t/6, 10*time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	ep := l.ep
	if ep == nil || ep.lost || ep.held <= 0 {
		return false, interval
	}
	lossAt := ep.lastAck.Add(t * 2 / 3)
	if !now.Before(lossAt) {
		l.loseLocked(ep)
		return false, interval
	}
	return now.Sub(ep.lastAck) >= interval, min(lossAt.Sub(now), interval)
}

var errClosed = fmt.Errorf("%w: zookeeper locker closed", guard.ErrUnavailable)

// call runs one ZooKeeper request, returning early with ctx's error when ctx
// ends first (the client library takes no context). A request the server
// answered, even with a "no node", is recorded as a sign of life.
func call[T any](ctx context.Context, l *Locker, op string, fn func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	l.requests.Add(1)
	sid, sent := l.conn.SessionID(), time.Now()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := fn()
		if err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNodeExists) {
			l.ack(sent, sid)
		}
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil && !errors.Is(r.err, zk.ErrNoNode) && !errors.Is(r.err, zk.ErrNodeExists) {
			return r.v, unavailable(op, r.err)
		}
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// unavailable wraps a client or server failure as guard.ErrUnavailable,
// keeping the zk error reachable with errors.Is.
func unavailable(op string, err error) error {
	if errors.Is(err, guard.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: zookeeper %s: %w", guard.ErrUnavailable, op, err)
}

// background runs f as a cleanup the Locker waits for on Close. It reports
// false, without running f, once the Locker is closed (the session's end
// removes the nodes anyway).
func (l *Locker) background(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		f()
	}()
	return true
}

// retry calls f until it reports done, backing off between attempts, and
// gives up when the Locker closes.
func (l *Locker) retry(f func() bool) {
	backoff := 50 * time.Millisecond
	for !f() {
		select {
		case <-l.quit:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Package zklock is a warden lock backend on Apache ZooKeeper, with the
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
// session of the Locker that created it: the session timeout
// (WithSessionTimeout, as negotiated with the server) is the lease TTL.
// Leases are driver.SessionLeases: guard sends nothing per lock and watches
// the session instead. The TTL given to guard only sizes guard's safety
// margin (a tenth of it), so the Locker accepts TTLs up to twice the session
// timeout (Limits), which keeps that margin within the session's slack; a
// server that grants less than asked makes an acquisition refuse a TTL
// Limits allowed but over twice the granted timeout (ErrInvalidOption).
//
// # When a lease is lost
//
// The server expires a session once it has heard nothing from the client for
// the session timeout T. A request the server answered proves it heard from
// the client no earlier than the moment the request was sent, so the Locker
// keeps, by the local monotonic clock, the send time of the latest answered
// request (sending a cheap heartbeat every T/6 while it holds leases). The
// session's Expiry is 2/3 T after it, at least T/3 before the server can
// expire the session and grant the lock to anyone else, and its Done is
// closed then without a newer answer, and at once when the session is
// reported expired or the Locker is closed. A lost lease stays lost even if
// the connection comes back: its owner must stop and Release it.
//
// A lease's node can also be deleted while its session lives, by an
// operator (ForceRelease). The Locker watches each held lease's node, so it
// hears of the deletion and the lease, a driver.RevocableLease, tells guard,
// which cancels the section. The watch costs the grant no round trip: a
// holder sets it a few milliseconds after its grant (watchDelay), without
// waiting, and a section released sooner never sets it. A deletion before
// then is found by the watch's read, so a forced release is heard up to
// watchDelay later than a watch set at the grant would hear it: the price
// of a grant that sends nothing more, alone in the queue or not (see
// contend).
//
// # Requests per acquisition
//
// An uncontended acquisition waits for one request, the create, which also
// tells the node's czxid and whether it is alone in its queue (see create);
// the data watch on its node follows, a request the acquisition does not
// wait for, sent watchDelay after the grant, so that a lease released
// sooner never sends it; its release is one delete. A queued contender
// lists the queue after its create, without a watch, and watches the node
// it queues behind; woken, it lists the queue again, or, when that node was
// the only one ahead of it, reads its own node, which sets its watch: five
// requests for an acquisition that waits once, the count of go-zookeeper's
// Lock. An exclusive lock's waiter skips the first listing when the
// Locker's latest listing of the queue names the node it queues behind and
// nobody else joined since, or the one who did is the contender whose
// release woke that listing, queuing again, whose node's name the Locker
// can tell from its last (see hint.go): four, which a holder that releases
// and queues again at once mostly gets.
//
// # Releases that get no answer
//
// A release whose delete gets no answer (a partition, a server restart)
// leaves the node to a background retry, which deletes it once the
// connection is back; if it never comes back, the session expires and takes
// the node with it. Either way no lock stays taken longer than the session
// timeout after its release.
//
// # Calls and their bounds
//
// The client library's calls take no context. Each request is made on a
// goroutine the Locker keeps for the purpose (see send), while its caller
// waits for the answer, its ctx or the request timeout, whichever comes
// first; a contender that gives up leaves the delete of its node to the
// background once its ctx has ended. So every call of the Locker and of its
// leases returns once its ctx is done, which the Locker declares
// (driver.ContextBounded), and guard calls it on the caller's goroutine
// instead of starting one of its own for each acquisition and release.
//
// # Reconnecting
//
// The Locker, not the client library, chooses which server each connection
// attempt goes to and when. A server that failed fast (refused the
// connection, or closed it, as servers do during an election) is tried
// again after a short jittered backoff, up to a twelfth of the session
// timeout (between 20ms and 1s); one that timed out (a frozen or
// unreachable server) is passed over for a sixth of it while the others are
// tried. So after a leader's failure a client is back within about that
// backoff of the ensemble serving again, where the library's own rotation,
// which pauses a second after every round of failures and comes back to a
// frozen server every round, made it a second or more. Requests wait for a
// connection rather than queue without one, and fail with
// driver.ErrUnavailable when a round of attempts has failed meanwhile, as
// they did with the library's rotation.
//
// An ensemble that lost its data (a server, or every server, restarted with
// an emptied data directory) turns away the handshake of a client that has
// seen later transactions than its own, which the library would retry
// forever. When a server closes a handshake unanswered, the Locker asks the
// server of the next attempt, on a connection of its own, whether the
// session lives, and only when it says no does the library start a new
// session, as after an expiry: the leases of the old one are declared lost
// first. An outage, a frozen server or a follower catching up keeps the
// session (see wipe.go).
//
// # A secured ensemble
//
// An ensemble shared by several teams protects its nodes with ACLs, most
// often digest ones: a node only user alice may use has the ACL
// zk.DigestACL(zk.PermAll, "alice", password). A Locker locks under such
// a root when its session has alice's credentials and its own nodes get an
// ACL that lets it use them:
//
//	l, err := zklock.New(servers,
//		zklock.WithRoot("/team/locks"),
//		zklock.WithAuth("digest", []byte("alice:"+password)),
//		zklock.WithACL(zk.AuthACL(zk.PermAll)...))
//
// zk.AuthACL stands for the session's own credentials: the server writes
// alice's digest ACL as it computes it. zk.DigestACL(zk.PermAll, "alice",
// password) names the same user with a hash computed by the client (SHA-1
// over the password's bytes), which is the server's only for a server that
// uses SHA-1 (not digestAlg=SHA-256) and decodes the password to the same
// bytes (an ASCII one, or UTF-8 on a server whose charset is UTF-8):
// otherwise it grants no one, the Locker itself included. The credentials go
// with every connection the Locker makes, before any request (see WithAuth);
// New refuses an ACL under which they could not create and delete the
// Locker's nodes. A session without them (or with a wrong password) is
// refused by the root's ACL: its calls fail at once with an error wrapping
// zk.ErrNoAuth, a waiting Acquire's too. The idempotency Store and the Fence
// use a connection of the caller's, to which the caller adds the credentials
// (Conn.AddAuth).
//
// Fencing tokens are the czxid of the contender's node: ZooKeeper's
// transaction ids grow across the whole ensemble, and the holders of a lock
// are granted in creation order.
package zklock

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

const (
	// DefaultRoot is the node under which locks live unless WithRoot is
	// given.
	DefaultRoot = "/warden/locks"
	// DefaultSessionTimeout is the session timeout, and so the lease TTL,
	// unless WithSessionTimeout says otherwise.
	DefaultSessionTimeout = 30 * time.Second
)

// Option configures a Locker. An invalid value makes New fail.
type Option func(*config) error

type config struct {
	root           string
	acl            []zk.ACL
	logger         zk.Logger
	sessionTimeout time.Duration
	requestTimeout time.Duration
	creds          []credential
}

// WithRoot sets the persistent node under which lock nodes are created. It
// must be a path ZooKeeper accepts, absolute, other than "/", without a
// trailing slash, an empty, "." or ".." element, or the characters
// ZooKeeper refuses (control characters among them). It is created on
// first use.
func WithRoot(path string) Option {
	return func(c *config) error {
		if err := checkRoot(path); err != nil {
			return fmt.Errorf("%w: zookeeper root %q: %w", driver.ErrInvalidOption, path, err)
		}
		c.root = path
		return nil
	}
}

// checkRoot says why path cannot be a root, by the rules of ZooKeeper's own
// path validation: a bad root fails every request with
// "invalid path", which a waiting acquisition would retry until its
// context ends.
func checkRoot(path string) error {
	switch {
	case !strings.HasPrefix(path, "/"):
		return errors.New("want an absolute path")
	case path == "/":
		return errors.New("want a node other than /")
	case strings.HasSuffix(path, "/"):
		return errors.New("trailing slash")
	case !utf8.ValidString(path):
		return errors.New("not UTF-8")
	}
	for elem := range strings.SplitSeq(path[1:], "/") {
		switch elem {
		case "":
			return errors.New("empty element (doubled slash)")
		case ".", "..":
			return fmt.Errorf("relative element %q", elem)
		}
	}
	for _, r := range path {
		if r <= 0x1f || (r >= 0x7f && r <= 0x9f) || (r >= 0xd800 && r <= 0xf8ff) || (r >= 0xfff0 && r <= 0xffff) {
			return fmt.Errorf("character %U, which ZooKeeper refuses", r)
		}
	}
	return nil
}

// WithACL sets the ACL of every node the Locker creates (default: world
// readable and writable, zk.WorldACL(zk.PermAll)). It must let the Locker's
// session read, create and delete: a request the ACL refuses fails the
// call at once, a waiting Acquire too, with an error wrapping
// driver.ErrUnavailable and zk.ErrNoAuth (zk.ErrInvalidACL for an ACL the
// server will not set). Without read, a lock is granted only to a
// contender found alone in its queue, and its lease hears nothing of a
// forced release. Write is not needed (see create). An ACL that grants
// create to an identity no entry matching it grants delete is refused
// (see checkACL), and so is one under which the Locker's own session, with
// the credentials WithAuth gives it, could not create and delete (see
// checkOwnACL): a digest ACL needs the digest credentials of its user,
// and zk.AuthACL, which stands for the session's authenticated
// identities, credentials that give one (a digest user's, not ip).
func WithACL(acl ...zk.ACL) Option {
	return func(c *config) error {
		if err := checkACL(acl); err != nil {
			return fmt.Errorf("%w: zookeeper ACL: %w", driver.ErrInvalidOption, err)
		}
		c.acl = acl
		return nil
	}
}

// checkACL says why acl cannot be the ACL of the nodes a Locker creates.
// ZooKeeper checks a delete against the ACL of the node's parent, which the
// first Locker to need it creates with its own ACL: an identity granted
// create but not delete could make contender nodes it could not remove, so
// that a lock it released would stay taken until its session ended, and
// the contenders queued behind it would wait until then. An identity has
// the rights of every entry that matches it, so create and delete may come
// from different entries.
func checkACL(acl []zk.ACL) error {
	if len(acl) == 0 {
		return errors.New("empty")
	}
	for _, e := range acl {
		if e.Perms&zk.PermCreate != 0 && !mayDelete(acl, e) {
			return fmt.Errorf("%s is granted create without delete (by no entry that matches it): every node made with the ACL must be deletable by whoever may create it", entryName(e))
		}
	}
	return nil
}

// entryName names ACL entry e's identity for an error: scheme:id, or for
// a digest entry its user alone, whose id's hash (an unsalted one of the
// password) an error must not show.
func entryName(e zk.ACL) string {
	if e.Scheme == "digest" {
		user, _, _ := strings.Cut(e.ID, ":")
		return fmt.Sprintf("digest user %q", user)
	}
	return e.Scheme + ":" + e.ID
}

// mayDelete reports whether an entry of acl grants delete to the identity
// e names, or may: only a refusal that is sure is worth making. world:anyone
// matches everyone, and a scheme:id itself; a digest entry matches its own
// id alone, and world's only id is anyone; two ip entries match a client
// in common when their addresses or ranges share an address. Whether an
// x509 or sasl entry (or an ip entry this cannot read) matches another of
// its scheme depends on the server (a provider's rules), and "auth" stands
// for the creating session's credentials, whatever their scheme: those are
// taken to match.
func mayDelete(acl []zk.ACL, e zk.ACL) bool {
	for _, d := range acl {
		switch {
		case d.Perms&zk.PermDelete == 0:
		case d.Scheme == "world" && d.ID == "anyone", d.Scheme == e.Scheme && d.ID == e.ID:
			return true
		case d.Scheme == "auth" || e.Scheme == "auth":
			return true
		case d.Scheme == "ip" && e.Scheme == "ip":
			if ipsMeet(d.ID, e.ID) {
				return true
			}
		case d.Scheme == e.Scheme && d.Scheme != "world" && d.Scheme != "digest":
			return true
		}
	}
	return false
}

// ipsMeet reports whether two ip scheme ids (an address, or an address and
// a prefix length, "10.0.0.0/8") may match one client: whether their ranges
// share an address, or, when either cannot be read, true.
func ipsMeet(a, b string) bool {
	pa, okA := ipRange(a)
	pb, okB := ipRange(b)
	if !okA || !okB {
		return true
	}
	return pa.Overlaps(pb)
}

// ipRange reads an ip scheme id as a prefix: an address alone is its own.
func ipRange(id string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(id); err == nil {
		return p.Masked(), true
	}
	if a, err := netip.ParseAddr(id); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	return netip.Prefix{}, false
}

// WithLogger sets where the ZooKeeper client logs connection errors, and the
// Locker a node it may not delete and credentials the ensemble refused
// (default zk.DefaultLogger, the standard log package).
func WithLogger(l zk.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", driver.ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// WithSessionTimeout sets the session timeout the Locker asks the server
// for (default DefaultSessionTimeout; the server may adjust it to its
// minSessionTimeout..maxSessionTimeout range, and the Locker follows what it
// grants). It is the TTL of every lease: how long a crashed holder keeps its
// locks. A server grants at most its maxSessionTimeout (by default twenty
// ticks, 40s), and an acquisition whose TTL Limits allowed but is over
// twice what it granted fails (see Limits).
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 100*time.Millisecond || d > maxSessionTimeout {
			return fmt.Errorf("%w: zookeeper session timeout %v, want 100ms to %v", driver.ErrInvalidOption, d, maxSessionTimeout)
		}
		c.sessionTimeout = d
		return nil
	}
}

// maxSessionTimeout is the longest session timeout the protocol can ask
// for: it counts milliseconds in 32 bits.
const maxSessionTimeout = math.MaxInt32 * time.Millisecond

// WithRequestTimeout bounds each request to the ensemble (default: the
// session timeout in force, the server's once a connection has told it),
// so that an unreachable ensemble fails calls with driver.ErrUnavailable
// instead of blocking them until their context ends.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: zookeeper request timeout %v", driver.ErrInvalidOption, d)
		}
		c.requestTimeout = d
		return nil
	}
}

// Locker is a driver.Locker on one ZooKeeper session. It also offers read/write
// locks (driver.RWLocker) and semaphores (driver.Semaphorer). It is safe for
// concurrent use; each Locker is one session, so separate processes (or
// clients that must not share fate) need separate Lockers.
type Locker struct {
	conn           *zk.Conn
	root           string
	acl            []zk.ACL
	logger         zk.Logger
	timeout        time.Duration // as asked at New
	requestTimeout time.Duration // WithRequestTimeout's; 0 for the default (see requestLimit)
	creds          credentials   // WithAuth's, sent on every connection (see auth.go)

	hosts    *hosts
	rollback rollback // the session of a server that lost its data (see wipe.go)
	// last is the latest connection dial made; only the client library's
	// connection loop, which calls dial, touches it.
	last       net.Conn
	negotiated atomic.Int64 // session timeout the server granted, in ms; 0 until known
	requests   atomic.Int64 // requests sent for lock operations (heartbeats not counted)
	heartbeats atomic.Int64
	watching   atomic.Int64 // data watches on leases' nodes being set (see watchLater)
	// plainCreate: the ACL refused the create's write of the parent's
	// data, so contender nodes are created alone (see create).
	plainCreate atomic.Bool
	hints       hints // the latest listings of lock queues (see hint.go)

	mu     sync.Mutex
	ep     *epoch            // leases granted since the session was last known healthy
	leases map[string]*lease // live leases by node, for their revocation
	// Leases granted without a watch on their node, in grant order, each to
	// set one watchDelay after its grant (see watchAfter); those forgotten
	// meanwhile stay until the timer passes them, and unwatchedLive counts
	// the others. watchTimer fires when the first of them is due.
	unwatched     []*lease
	unwatchedLive int
	watchTimer    *time.Timer
	closed        bool
	bg            sync.WaitGroup // background cleanups and the monitor

	runners runners // make the requests of calls (see send)

	quit chan struct{}
	// retimed tells the monitor that the server granted a session timeout
	// other than the one its sleep was timed with.
	retimed chan struct{}
}

// epoch groups the leases that share a fate: those granted on one session
// since the Locker last had to declare its leases lost.
type epoch struct {
	l       *Locker
	session int64
	done    chan struct{}
	// guarded by Locker.mu
	lastAck time.Time // send time of the latest request the server answered
	held    int
	lost    bool
}

// New connects to the ZooKeeper ensemble servers (host:port each, a host
// alone meaning port 2181, one element a server; a chroot is given with
// WithRoot). It does not wait for the session: operations wait for it, up
// to the request timeout, or fail with driver.ErrUnavailable. An invalid
// option or address is an error wrapping driver.ErrInvalidOption. Close the
// Locker to end its session.
func New(servers []string, opts ...Option) (*Locker, error) {
	cfg := config{root: DefaultRoot, acl: zk.WorldACL(zk.PermAll), logger: zk.DefaultLogger, sessionTimeout: DefaultSessionTimeout}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := checkOwnACL(cfg.acl, cfg.creds); err != nil {
		return nil, fmt.Errorf("%w: zookeeper ACL: %w", driver.ErrInvalidOption, err)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w: no zookeeper servers", driver.ErrInvalidOption)
	}
	for _, s := range servers {
		if strings.TrimSpace(s) == "" {
			return nil, fmt.Errorf("%w: empty zookeeper server address in %q", driver.ErrInvalidOption, servers)
		}
		if err := checkServer(s); err != nil {
			return nil, fmt.Errorf("%w: zookeeper server address %q: %w", driver.ErrInvalidOption, s, err)
		}
	}
	l := &Locker{root: cfg.root, acl: cfg.acl, logger: cfg.logger, timeout: cfg.sessionTimeout, requestTimeout: cfg.requestTimeout,
		leases: map[string]*lease{}, quit: make(chan struct{}), retimed: make(chan struct{}, 1)}
	l.creds.set(cfg.creds)
	rand.Read(l.hints.seed[:])
	l.hosts = newHosts(l.quit, cfg.sessionTimeout)
	conn, _, err := zk.Connect(servers, cfg.sessionTimeout,
		zk.WithHostProvider(l.hosts),
		zk.WithDialer(l.dial),
		zk.WithEventCallback(l.onEvent),
		zk.WithLogger(cfg.logger),
		zk.WithLogInfo(false))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrUnavailable, err)
	}
	l.conn = conn
	l.bg.Add(1)
	go l.monitor()
	return l, nil
}

// checkServer says why addr, a server's address as New takes it, could
// never be dialed: the client library splits it into a host and a port (a
// host alone means port 2181) and dials that, so a bad port would fail
// every connection attempt, as an outage.
func checkServer(addr string) error {
	if strings.Contains(addr, ",") {
		return commaList(addr)
	}
	_, port, err := net.SplitHostPort(zk.FormatServers([]string{addr})[0])
	if err != nil {
		return err
	}
	if _, path, ok := strings.Cut(port, "/"); ok {
		return fmt.Errorf("a chroot (/%s after the port) is not supported: give the path to WithRoot", path)
	}
	if n, err := net.LookupPort("tcp", port); err != nil || n == 0 {
		return fmt.Errorf("port %q, want 1 to 65535 or a service's name", port)
	}
	return nil
}

// commaList is the error for addr, a list of servers in one string, as
// the Java client's connect string has them: the client library would take
// it for one host and fail every connection attempt.
func commaList(addr string) error {
	list, chroot, ok := strings.Cut(addr, "/")
	hint := ""
	if ok {
		hint = fmt.Sprintf(", and the chroot (/%s) to WithRoot", chroot)
	}
	return fmt.Errorf("a comma-separated list: give each server as its own element (%q)%s", strings.Split(list, ","), hint)
}

var (
	_ driver.Locker     = (*Locker)(nil)
	_ driver.RWLocker   = (*Locker)(nil)
	_ driver.Semaphorer = (*Locker)(nil)
	_ driver.Limiter    = (*Locker)(nil)

	_ driver.ContextBounded = (*Locker)(nil)
)

// BoundedByContext implements driver.ContextBounded: every call of the
// Locker and of its leases returns once its ctx is done, since each
// request is made on a runner that the caller stops waiting for (see
// send), and a contender that gives up leaves its node's delete to the
// background. guard then calls it on the caller's goroutine, without one
// of its own for each acquisition and release.
func (l *Locker) BoundedByContext() bool { return true }

// Limits implements driver.Limiter: the TTL given to guard sizes only its
// safety margin here (the session keeps the leases), so it may be at most
// twice the session timeout, which keeps that margin under a fifth of it.
// It is the timeout asked for: the server may grant less, which only the
// session's first connection tells, and an acquisition then refuses a TTL
// within Limits but over twice what it granted (see checkTTL).
func (l *Locker) Limits() driver.Limits { return driver.Limits{MaxTTL: 2 * l.timeout} }

// checkTTL refuses ttl, with driver.ErrInvalidOption, when Limits allowed
// it but it is over twice the session timeout the server granted: guard's
// margin, a tenth of the TTL, would then be more than the session's Expiry
// ever lies ahead, and guard would declare every lease lost as soon as it
// was granted. A TTL past Limits is guard's to refuse; the Locker itself
// keeps a lease by its session whatever the TTL.
func (l *Locker) checkTTL(ttl time.Duration) error {
	if t := l.sessionTimeout(); ttl > 2*t && ttl <= 2*l.timeout {
		return fmt.Errorf("%w: ttl %v is over twice the zookeeper session timeout %v the server granted (%v asked; it grants at most its maxSessionTimeout): lower the ttl to at most %v, or raise the server's maxSessionTimeout to at least %v",
			driver.ErrInvalidOption, ttl, t, l.timeout, 2*t, (ttl+1)/2)
	}
	return nil
}

// Close ends the session: every lease of the Locker is released at once (the
// server deletes its ephemeral nodes) and the session is reported lost.
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
	l.runners.Close()
	l.bg.Wait()
	return nil
}

// isClosed reports whether Close has been called.
func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// dial connects like net.DialTimeout, once hosts lets the attempt go, and
// reads, from the connect response that starts every connection, the
// session timeout the server granted: the client library keeps it to
// itself, and the loss rule, the handshake's limit and the time a frozen
// server is passed over for must use the server's figure, not the one
// asked for, which may be longer than the session lives.
func (l *Locker) dial(network, address string, timeout time.Duration) (net.Conn, error) {
	if err := l.creds.refusal(); err != nil {
		// Refused credentials would be refused on every connection: as
		// ZooKeeper's own client, the Locker makes no more. The client
		// library asks once, and waits here until Close; the line says
		// why the Locker then stays disconnected.
		l.logger.Printf("zklock: no further connection: %v", err)
		<-l.quit
		return nil, errClosed
	}
	if !l.hosts.wait() {
		return nil, errClosed
	}
	if l.last != nil {
		// The library leaves open a connection whose server answered
		// that the session expired.
		l.last.Close()
		l.last = nil
	}
	l.rollback.check(network, address, l.sessionTimeout())
	select {
	case <-l.quit:
		// Closed while a probe was out.
		return nil, errClosed
	default:
	}
	c, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		if isTimeout(err) {
			l.hosts.slow()
		}
		return nil, err
	}
	sc := newSniffConn(c, l.sessionTimeout()/6, l.hosts.slow, func(ms int32) {
		if ms > 0 && l.negotiated.Swap(int64(ms)) != int64(ms) {
			l.hosts.retime(time.Duration(ms) * time.Millisecond)
			select {
			case l.retimed <- struct{}{}:
			default:
			}
		}
	})
	sc.rb = &l.rollback
	if len(l.creds.list) > 0 {
		sc.creds, sc.helloLeft = &l.creds, -1
	}
	l.last = sc
	return sc, nil
}

// connBuffer is the size of a connection's read buffer: the client library
// reads each frame in two reads, its length and then the rest, which
// unbuffered are two system calls though the frame arrived whole; buffered,
// the second read, and those of frames that arrived together, are answered
// from memory. It holds the frames of a lock's requests and watch events
// many times over; a larger frame is read past it.
const connBuffer = 4096

// sniffConn watches the first 12 bytes a connection reads: the frame length,
// the protocol version and the negotiated timeout of the connect response.
// Until they have come it also caps the connection's deadlines at
// handshake from when they are set: the client library gives the connect
// handshake ten times two thirds of the session timeout, so a server that
// accepts connections but never answers (a frozen process) would hold the
// client for longer than the session lives, instead of letting it try the
// next server while its session can still be saved. It reports a read or
// write that timed out, so that hosts passes the server over for a while.
// It reads through a buffer (see connBuffer). With a rollback, it hands
// it the handshake, the connection's first write, and tells it when the
// server closed the connection without answering (see wipe.go). With
// credentials, it sends their setAuth requests and reads their answers
// itself (see auth.go): the client library neither sends nor expects them.
type sniffConn struct {
	net.Conn
	in        *bufio.Reader // over fill
	head      []byte
	handshake time.Duration
	granted   func(ms int32)
	timedOut  func()
	rb        *rollback
	wrote     bool   // the handshake was written
	probe     []byte // what rb probes with when the handshake gets no answer
	// creds are sent once the connect response is read, and their
	// answers then read before anything else is passed on; nil once done,
	// or when the response carries no session.
	creds     *credentials
	helloLeft int   // bytes of the connect response to pass on; -1 until known
	authErr   error // the credentials could not be sent
}

// newSniffConn watches c, capping its deadlines at handshake until the
// connect response has come, which it hands to granted; timedOut hears of
// reads and writes that timed out.
func newSniffConn(c net.Conn, handshake time.Duration, timedOut func(), granted func(ms int32)) *sniffConn {
	sc := &sniffConn{Conn: c, handshake: handshake, timedOut: timedOut, granted: granted}
	sc.in = bufio.NewReaderSize(readFunc(sc.fill), connBuffer)
	return sc
}

func (c *sniffConn) capped(t time.Time) time.Time {
	if len(c.head) >= 12 || t.IsZero() {
		return t
	}
	if limit := time.Now().Add(c.handshake); t.After(limit) {
		return limit
	}
	return t
}

func (c *sniffConn) SetReadDeadline(t time.Time) error  { return c.Conn.SetReadDeadline(c.capped(t)) }
func (c *sniffConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.capped(t)) }
func (c *sniffConn) SetDeadline(t time.Time) error      { return c.Conn.SetDeadline(c.capped(t)) }

func (c *sniffConn) Write(p []byte) (int, error) {
	if !c.wrote && c.rb != nil {
		c.wrote = true
		p, c.probe = c.rb.handshake(p)
	}
	n, err := c.Conn.Write(p)
	if err != nil && isTimeout(err) {
		c.timedOut()
	}
	return n, err
}

// Read passes the connect response on. With credentials, and a session in
// the response, it sends the credentials as the response's last bytes are
// read: the client library, reading them, sends nothing yet, so no
// request of its own goes before them, and the handshake went alone, as
// ZooKeeper's own client sends it (a server that closes the connection on
// its answer, to a client whose session expired, would otherwise close it
// on unread bytes, which resets it and may lose the answer). It then
// reads their answers, which come next, itself.
func (c *sniffConn) Read(p []byte) (int, error) {
	if c.creds == nil {
		return c.in.Read(p)
	}
	if c.authErr != nil {
		return 0, c.authErr
	}
	if c.helloLeft < 0 {
		h, err := c.in.Peek(answerMinBytes)
		if err != nil {
			return 0, err
		}
		c.helloLeft = 4 + int(binary.BigEndian.Uint32(h))
		if binary.BigEndian.Uint64(h[answerSession:]) == 0 {
			// No session: the server closes the connection.
			c.creds = nil
			return c.in.Read(p)
		}
	}
	if c.helloLeft == 0 {
		err := c.creds.readAnswers(c.in)
		c.creds = nil
		if err != nil {
			return 0, err
		}
		return c.in.Read(p)
	}
	n, err := c.in.Read(p[:min(len(p), c.helloLeft)])
	if c.helloLeft -= n; c.helloLeft == 0 && err == nil {
		c.authErr = c.sendCreds()
	}
	return n, err
}

// sendCreds writes the setAuth requests of the credentials. A write that
// failed may have sent part of them: the connection is closed, so that the
// client library's next request cannot follow a half-written packet, which
// the server would read as its rest.
func (c *sniffConn) sendCreds() error {
	c.Conn.SetWriteDeadline(time.Now().Add(c.handshake))
	_, err := c.Conn.Write(c.creds.requests)
	c.Conn.SetWriteDeadline(time.Time{})
	if err != nil {
		if isTimeout(err) {
			c.timedOut()
		}
		c.Conn.Close()
	}
	return err
}

// fill reads from the connection itself, for the buffer.
func (c *sniffConn) fill(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && isTimeout(err) {
		c.timedOut()
	}
	if err != nil && len(c.head) == 0 && c.probe != nil && !isTimeout(err) {
		c.rb.closed(c.probe)
		c.probe = nil
	}
	if len(c.head) < 12 && n > 0 {
		c.head = append(c.head, p[:min(n, 12-len(c.head))]...)
		if len(c.head) == 12 {
			c.granted(int32(binary.BigEndian.Uint32(c.head[8:12])))
		}
	}
	return n, err
}

// readFunc is an io.Reader made of a function.
type readFunc func(p []byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// requestLimit bounds each request: WithRequestTimeout's, or else the
// session timeout in force, past which an unanswered request is no use to
// a session that has ended.
func (l *Locker) requestLimit() time.Duration {
	if l.requestTimeout > 0 {
		return l.requestTimeout
	}
	return l.sessionTimeout()
}

// sessionTimeout is the session timeout in force: the server's when known.
func (l *Locker) sessionTimeout() time.Duration {
	if ms := l.negotiated.Load(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return l.timeout
}

// onEvent runs on the client library's goroutine and must not block. It
// sees every watch event of the session, so the watches on held leases'
// nodes and queues need no goroutine of their own (the client library closes each
// watch's channel after its one event, so unread channels cost nothing).
func (l *Locker) onEvent(ev zk.Event) {
	switch ev.Type {
	case zk.EventSession:
		if ev.State == zk.StateDisconnected {
			l.hosts.down()
		}
		if ev.State == zk.StateExpired {
			l.rollback.expired()
		}
		if ev.State == zk.StateExpired || ev.State == zk.StateDisconnected && l.creds.refusal() != nil {
			// An expired session took its nodes with it; one whose
			// credentials were refused is not reached again.
			l.mu.Lock()
			if l.ep != nil {
				l.loseLocked(l.ep)
			}
			l.mu.Unlock()
		}
	case zk.EventNodeDeleted:
		l.revoke(ev.Path)
	case zk.EventNodeDataChanged:
		// A change of the node's data (an operator's, or a same-session
		// waiter's watch seeing a permit's mark) used the watch up.
		l.mu.Lock()
		le := l.leases[ev.Path]
		l.mu.Unlock()
		if le != nil {
			l.watchLater(le)
		}
	}
}

// revoke handles the deletion of node: when it is a live lease's, someone
// else deleted it, since a lease is forgotten before its owner's delete. The
// event came on the session, which therefore lives.
func (l *Locker) revoke(node string) {
	l.mu.Lock()
	le := l.leases[node]
	if le == nil || le.revoked {
		l.mu.Unlock()
		return
	}
	le.revoked = true
	f := le.revoke
	le.revoke = nil
	l.mu.Unlock()
	if f != nil {
		f()
	}
}

// watchDelay is how long a lease granted without a watch on its node
// waits before it sets one (see watchAfter): most sections are shorter, and
// their release then costs the ensemble no read; a deletion meanwhile is
// found by the watch's read, only later.
const watchDelay = 5 * time.Millisecond

// watchLater sets a data watch on le's node in the background.
func (l *Locker) watchLater(le *lease) {
	l.watching.Add(1)
	if !l.background(func() {
		defer l.watching.Add(-1)
		l.watch(le)
	}) {
		l.watching.Add(-1)
	}
}

// watchAfter sets a data watch on le's node, a lease just granted, after
// watchDelay, unless it is no longer tracked by then (see untrackLocked).
// The Locker's leases share one timer for it, armed only while one of them
// waits: a grant costs no timer of its own.
func (l *Locker) watchAfter(le *lease) {
	l.watching.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	le.watchAt = time.Now().Add(watchDelay)
	l.unwatched = append(l.unwatched, le)
	l.unwatchedLive++
	switch {
	case l.unwatchedLive > 1:
		// Armed already, for an earlier lease.
	case l.watchTimer == nil:
		l.watchTimer = time.AfterFunc(watchDelay, l.watchDue)
	default:
		l.watchTimer.Reset(watchDelay)
	}
}

// watchDue runs on the watch timer: it sets the watches that are due, and
// arms the timer for the next one.
func (l *Locker) watchDue() {
	l.mu.Lock()
	now := time.Now()
	var due []*lease
	passed := 0
	for _, le := range l.unwatched {
		if !le.watchAt.IsZero() {
			if le.watchAt.After(now) {
				break
			}
			le.watchAt = time.Time{}
			l.unwatchedLive--
			due = append(due, le)
		}
		passed++
	}
	n := copy(l.unwatched, l.unwatched[passed:])
	clear(l.unwatched[n:])
	l.unwatched = l.unwatched[:n]
	if l.unwatchedLive > 0 {
		// The first one left is one still waiting.
		l.watchTimer.Reset(l.unwatched[0].watchAt.Sub(now))
	}
	l.mu.Unlock()
	for _, le := range due {
		l.watchLater(le)
		l.watching.Add(-1)
	}
}

// watch sets a data watch on a lease's node, for a lease whose grant could
// not (a permit's grant writes its node, which would fire the watch) or
// whose watch was used up. It retries through connection errors while the
// lease is tracked; a node already gone was revoked.
func (l *Locker) watch(le *lease) {
	l.retry("watch of "+le.node, func() error {
		l.mu.Lock()
		live := l.leases[le.node] == le && !le.revoked
		l.mu.Unlock()
		if !live {
			return nil
		}
		l.requests.Add(1)
		_, _, _, err := l.conn.GetW(le.node)
		if errors.Is(err, zk.ErrNoNode) {
			l.revoke(le.node)
		}
		// A read the ACL refuses would be refused again: the lease goes
		// without its watch (see WithACL).
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrNoAuth) {
			return nil
		}
		return err
	})
}

// track makes le's node known to the event callback; grant calls it before
// the request that sets the watch, so that no event can come first.
func (l *Locker) track(le *lease) {
	l.mu.Lock()
	l.leases[le.node] = le
	l.mu.Unlock()
}

// untrack forgets le: it is being released, or its grant failed.
func (l *Locker) untrack(le *lease) {
	l.mu.Lock()
	l.untrackLocked(le)
	l.mu.Unlock()
}

func (l *Locker) untrackLocked(le *lease) {
	if l.leases[le.node] == le {
		delete(l.leases, le.node)
	}
	if !le.watchAt.IsZero() {
		le.watchAt = time.Time{}
		l.watching.Add(-1)
		if l.unwatchedLive--; l.unwatchedLive == 0 {
			l.watchTimer.Stop()
			clear(l.unwatched)
			l.unwatched = l.unwatched[:0]
		}
	}
	le.revoke = nil
}

// loseLocked declares ep lost, and forgets its leases: a lost lease is
// never revoked.
func (l *Locker) loseLocked(ep *epoch) {
	if ep.lost {
		return
	}
	ep.lost = true
	close(ep.done)
	for _, le := range l.leases {
		if le.ep == ep {
			l.untrackLocked(le)
		}
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

// grantEpoch puts le, on a node owned by session owner, in the epoch it
// joins, the node's existence having been confirmed by a request sent at
// sent.
func (l *Locker) grantEpoch(le *lease, owner int64, sent time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	ep := l.ep
	if ep != nil && !ep.lost && ep.session != owner {
		// A new session means the old one expired, and its nodes with it.
		l.loseLocked(ep)
	}
	if ep == nil || ep.lost || ep.session != owner {
		ep = &epoch{l: l, session: owner, done: make(chan struct{}), lastAck: sent}
		l.ep = ep
	}
	ep.held++
	le.ep = ep
	return nil
}

var _ driver.Session = (*epoch)(nil)

// Expiry implements driver.Session: 2/3 of the session timeout after the
// send time of the latest answered request, or the zero time once the epoch
// is lost.
func (ep *epoch) Expiry() time.Time {
	t := ep.l.sessionTimeout()
	ep.l.mu.Lock()
	defer ep.l.mu.Unlock()
	if ep.lost {
		return time.Time{}
	}
	return ep.lastAck.Add(t * 2 / 3)
}

// Done implements driver.Session.
func (ep *epoch) Done() <-chan struct{} { return ep.done }

// dropHeld takes le, being released, off its epoch's count of held leases,
// once however often it is released: a count taken down by a lease released
// twice would stop the heartbeats of the leases still held.
func (l *Locker) dropHeld(le *lease) {
	l.mu.Lock()
	if !le.released {
		le.released = true
		le.ep.held--
	}
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
		case <-l.retimed:
			// Asleep for a sixth of the timeout asked for, which may be
			// longer than the granted one's Expiry lies ahead.
		case <-timer.C:
		}
		due, next := l.check(time.Now())
		if due && !beating {
			beating = true
			l.heartbeats.Add(1)
			go func() {
				// Sent only once connected, so that the send time it
				// records is close to when the server hears it.
				up, _ := l.hosts.link()
				select {
				case <-up:
				case <-l.quit:
					beat <- struct{}{}
					return
				}
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

// Ping implements driver.Pinger: one read of the root node, bounded like
// every request.
func (l *Locker) Ping(ctx context.Context) error {
	_, err := call(ctx, l, "ping", func() (bool, error) {
		ok, _, err := l.conn.Exists(l.root)
		return ok, err
	})
	return err
}

// errClosed ends the calls of a closed Locker. It does not wrap
// driver.ErrUnavailable, which a waiting Acquire would retry forever.
var errClosed = errors.New("zklock: the Locker is closed")

// linked waits until a connection carries the session, so that a request
// sent then goes out at once rather than waiting in the client library's
// queue, from where it would go out, however stale, on the next connection.
// It fails as the library would have failed the queued request when a
// round of connection attempts fails, with ctx's error when ctx ends first,
// when timeout fires, and when the ensemble refused the credentials. Once
// the Locker is closed it lets the request go, for the library to fail it.
func (l *Locker) linked(ctx context.Context, op string, timeout <-chan time.Time) error {
	if err := l.creds.refusal(); err != nil {
		return err
	}
	up, round := l.hosts.link()
	select {
	case <-up:
		return nil
	default:
	}
	select {
	case <-l.creds.refused:
		return l.creds.err
	case <-up:
		return nil
	case <-l.quit:
		return nil
	case <-round:
		return unavailable(op, zk.ErrNoServer)
	case <-timeout:
		return unavailable(op, fmt.Errorf("no connection within %v", l.requestLimit()))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// call runs one ZooKeeper request on a runner, returning early with ctx's
// error when ctx ends first (the client library takes no context), or with
// driver.ErrUnavailable when the request timeout passes. A request the
// server answered, even with a "no node", is recorded as a sign of life.
func call[T any](ctx context.Context, l *Locker, op string, fn func() (T, error)) (T, error) {
	a := &answer[T]{l: l, fn: fn}
	if err := l.send(ctx, op, a); err != nil {
		var zero T
		return zero, err
	}
	if a.err != nil && !serverAnswered(a.err) {
		return a.v, l.failed(unavailable(op, a.err))
	}
	return a.v, a.err
}

// failed is err, the failure of a request, as its caller sees it: once the
// ensemble refused the credentials, that refusal, which closed the
// connection; a refusal by the ACL names the session's credentials.
func (l *Locker) failed(err error) error {
	if refused := l.creds.refusal(); refused != nil {
		return refused
	}
	if errors.Is(err, errDenied) && len(l.creds.list) > 0 {
		return fmt.Errorf("%w (the session has the credentials of %s)", err, describe(l.creds.list))
	}
	return err
}

// answer is the request of a call, and its result.
type answer[T any] struct {
	l   *Locker
	fn  func() (T, error)
	v   T
	err error
}

func (a *answer[T]) Run() {
	a.l.requests.Add(1)
	sid, sent := a.l.conn.SessionID(), time.Now()
	a.v, a.err = a.fn()
	if a.err == nil || serverAnswered(a.err) {
		a.l.ack(sent, sid)
	}
}

func (a *answer[T]) Abandoned() {}

// serverAnswered reports whether err is an answer of the server's that a
// call returns as it is.
func serverAnswered(err error) bool {
	return errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNodeExists)
}

// unavailable wraps a client or server failure as driver.ErrUnavailable,
// keeping the zk error reachable with errors.Is; a refusal for want of
// rights wraps errDenied.
func unavailable(op string, err error) error {
	if errors.Is(err, driver.ErrUnavailable) {
		return err
	}
	if deniedByACL(err) {
		return fmt.Errorf("%w: zookeeper %s: %w", errDenied, op, err)
	}
	return fmt.Errorf("%w: zookeeper %s: %w", driver.ErrUnavailable, op, err)
}

// deniedByACL reports whether err is the ensemble's refusal of a request
// for want of rights, or of the ACL it would create a node with (see
// errDenied): the same request is refused again until someone changes an
// ACL or the session's credentials.
func deniedByACL(err error) bool {
	return errors.Is(err, zk.ErrNoAuth) || errors.Is(err, zk.ErrInvalidACL)
}

// notSentOr is err, the failure of a delete (a forced release's, an
// idempotency record's), marked driver.NotSent when it proves that the
// delete changed nothing: the client tried every server of the ensemble,
// in vain, while the request waited unsent (zk.ErrNoServer, which the
// library gives only requests still queued, and linked those it holds
// back), or the ensemble refused it for want of rights (a multi is
// refused whole).
func notSentOr(err error) error {
	if errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrNoAuth) {
		return driver.NotSent(err)
	}
	return err
}

// errDenied: the ensemble refused a request for want of rights (the ACL of
// the node it touches does not allow it to the session), or refused the ACL
// the Locker creates nodes with (the "auth" scheme on a session without
// credentials). A waiting Acquire does not retry it: the same request would
// be refused again until its context ended, which would say nothing of why.
var errDenied = fmt.Errorf("%w: refused by the ACL", driver.ErrUnavailable)

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

// retry calls f until it returns nil, and gives up when the Locker closes.
// What it retries is mostly a node that keeps a lock taken, so a failure of
// the ensemble, which may be back any moment, is tried again soon. A
// refusal by the ACL (an error wrapping errDenied; another client may have
// changed a parent's ACL, and checkACL keeps only the Locker's own from
// refusing a delete) is tried again once per session timeout: the
// session's credentials are set once for all (WithAuth), so only a client
// that mends the ACL ends it, which an operator may do at any time. The
// refusal is logged once, as what, and so is a success after it. Refused
// credentials end it: no request goes out again, and the session's end
// removes the node.
func (l *Locker) retry(what string, f func() error) {
	backoff := driver.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	refused := false
	for {
		err := f()
		if err == nil {
			if refused {
				l.logger.Printf("zklock: %s succeeded after the ACL's refusal", what)
			}
			return
		}
		if l.creds.refusal() != nil {
			return
		}
		wait := backoff.Next()
		if errors.Is(err, errDenied) {
			if !refused {
				l.logger.Printf("zklock: %s refused by the ACL (%v): tried again every %v until the ACL allows it or the Locker closes (whose session's end removes the node), and a lock the node holds stays taken until then", what, err, l.sessionTimeout())
			}
			refused, wait = true, l.sessionTimeout()
		}
		select {
		case <-l.quit:
			return
		case <-time.After(wait):
		}
	}
}

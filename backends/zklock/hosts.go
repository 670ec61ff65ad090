package zklock

import (
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// hosts is the Locker's zk.HostProvider: it chooses the server each
// connection attempt goes to, and when.
//
// The client library's own provider tries the servers in a fixed rotation
// and, after every round of attempts that all failed, pauses for a second
// and fails the requests waiting to be sent. After a leader's failure that
// pause comes just when the followers, in the election, close every
// connection at once, so a client would reconnect up to a second after the
// ensemble serves again; and the rotation brings it back, round after
// round, to a frozen server, which costs a handshake timeout each time.
// hosts never asks for that pause (except to let the library see that it is
// closed): a server that failed fast (refused the connection, or closed it
// as a server without a quorum does) is retried after a short jittered
// backoff, and one that timed out (a frozen or unreachable server) only
// after slowFor, so that the others are tried in the meantime. Without the
// pause the library never fails the requests queued without a connection,
// which would go out, however stale, on the next one: link tells the
// Locker when a connection carries the session, which requests wait for,
// and when a round of attempts has failed, which fails them instead (see
// Locker.linked).
type hosts struct {
	quit <-chan struct{} // the Locker's: closed by Close

	mu      sync.Mutex
	slowFor time.Duration // a sixth of the session timeout (see retime)
	servers []*host
	last    *host // returned by the latest Next
	held    bool  // last got a session (Connected) since
	failed  int   // failed attempts since the last session or round
	due     time.Time
	backoff driver.Backoff
	up      chan struct{} // closed while a connection carries the session
	round   chan struct{} // closed, and replaced, when a round of attempts failed
}

// host is one server's record.
type host struct {
	addr     string
	retryAt  time.Time // not to be tried before
	tried    time.Time // the latest attempt
	timedOut bool      // the latest attempt, or connection, timed out
}

var _ zk.HostProvider = (*hosts)(nil)

// newHosts returns the provider of a Locker whose session timeout is
// sessionTimeout: a server that timed out is passed over for a sixth of it
// (the handshake limit, see sniffConn), and the backoff after fast
// failures grows to a twelfth of it, between 20ms and a second, which keeps
// a client of a short session quick to come back after an election and
// one of a long session from knocking at a down ensemble several times a
// second.
func newHosts(quit <-chan struct{}, sessionTimeout time.Duration) *hosts {
	most := min(max(sessionTimeout/12, 20*time.Millisecond), time.Second)
	return &hosts{
		quit:    quit,
		slowFor: sessionTimeout / 6,
		backoff: driver.Backoff{Min: most / 16, Max: most},
		up:      make(chan struct{}),
		round:   make(chan struct{}),
	}
}

// Init implements zk.HostProvider: the client library's own provider
// resolves the names, each address becoming one server, as it does.
func (h *hosts) Init(servers []string) error {
	dns := zk.NewDNSHostProvider()
	if err := dns.Init(servers); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for range dns.Len() {
		addr, _ := dns.Next()
		h.servers = append(h.servers, &host{addr: addr})
	}
	return nil
}

// Len implements zk.HostProvider.
func (h *hosts) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.servers)
}

// Next implements zk.HostProvider. It is called before every connection
// attempt, so the previous one has failed, or its connection has ended. It
// picks the server that may be tried the soonest, the least recently tried
// among equals, and dial waits until then. retryStart is reported only once
// the Locker is closed: the library then fails its waiting requests and,
// seeing that it is closed, stops.
func (h *hosts) Next() (server string, retryStart bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.quit:
		h.due = time.Time{}
		return h.servers[0].addr, true
	default:
	}
	now := time.Now()
	if prev := h.last; prev != nil {
		if prev.timedOut {
			prev.retryAt = now.Add(h.slowFor)
		} else {
			prev.retryAt = now.Add(h.backoff.Next())
		}
		prev.timedOut = false
		if !h.held {
			h.failed++
		}
		if h.failed >= len(h.servers) {
			h.failed = 0
			close(h.round)
			h.round = make(chan struct{})
		}
	}
	next := h.servers[0]
	for _, s := range h.servers[1:] {
		if s.retryAt.Before(next.retryAt) || s.retryAt.Equal(next.retryAt) && s.tried.Before(next.tried) {
			next = s
		}
	}
	next.tried = now
	h.last, h.held, h.due = next, false, next.retryAt
	return next.addr, false
}

// Connected implements zk.HostProvider: the latest attempt got its session.
func (h *hosts) Connected() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held, h.failed = true, 0
	h.backoff.Reset()
	select {
	case <-h.up:
	default:
		close(h.up)
	}
}

// down records that the connection carrying the session has ended.
func (h *hosts) down() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.up:
		h.up = make(chan struct{})
	default:
	}
}

// wait holds the connection attempt Next chose until its server may be
// tried. It reports false once the Locker is closed.
func (h *hosts) wait() bool {
	h.mu.Lock()
	d := time.Until(h.due)
	h.mu.Unlock()
	if d <= 0 {
		select {
		case <-h.quit:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-h.quit:
		return false
	case <-t.C:
		return true
	}
}

// retime sets how long a server that timed out is passed over for from
// the session timeout the server granted, once known.
func (h *hosts) retime(sessionTimeout time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.slowFor = sessionTimeout / 6
}

// slow records that the latest attempt, or its connection, timed out.
func (h *hosts) slow() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last != nil {
		h.last.timedOut = true
	}
}

// link returns a channel closed while a connection carries the session,
// and one closed when the round of attempts under way has failed.
func (h *hosts) link() (up, round <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.up, h.round
}

package zklock

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// A ZooKeeper server closes, without an answer, the connection of a client
// whose handshake says it has seen a later transaction (its lastZxidSeen)
// than the server's own last one, so that the client tries a server that
// is not behind it. In a live ensemble that is a follower catching up, and
// the next server takes the client. A server, or an ensemble, that lost its
// data is behind for good, and the client library forgets the transaction
// id it sends only when a server answers that its session expired, which a
// server that closes the handshake never says: the Locker would never
// connect again.
//
// So when a server closes a handshake that carried a session and a
// transaction id without answering it, the Locker asks a server, on a
// connection of its own before the library's next attempt, whether the
// session lives: it sends the library's handshake again with lastZxidSeen
// 0, which no server refuses for being behind. A server that serves
// answers either with the session (it lives: a follower behind the
// client, whose probe connection the Locker just closes; it reads nothing
// there, so it sees nothing older than it saw before) or with no session,
// which it says only when the ensemble does not know the session: it
// expired, or the server lost it with its data. Only then does the
// library's next handshake go with lastZxidSeen 0 too; the server answers
// that the session expired, and the library starts a new session as after
// any expiry. The Locker declares its leases lost on that event, before
// the new session exists, so nothing is granted on it while a lease of the
// old one is held. A handshake closed for any other reason (a server not
// yet serving, in an election, over its connection limit) gets no answer
// to the probe either, and a server down or frozen closes nothing: an
// outage keeps the session as before.
//
// A probe that finds the session takes it up, as any handshake does, so
// the server counts its session timeout from then. A server restored from
// an older copy of its data knows the session but not the transactions
// the client saw since, and would turn the library away for as long as
// probes kept the session alive: after a probe found it living, the
// Locker sends none for twice the session timeout, longer than the
// server lets a session it hears nothing of live (the timeout, rounded up
// to the server's tick, at most half of it), and the next probe finds it
// expired.
//
// A probe sends the handshake alone: it makes no request, so it needs none
// of the credentials (WithAuth) the Locker's connections send after it.
type rollback struct {
	mu sync.Mutex
	// refused is the handshake, lastZxidSeen zeroed, that a server closed
	// the connection on without an answer, until a probe has sent it.
	refused []byte
	// gone: a server said the session does not live; handshakes go with
	// lastZxidSeen 0 until the library has heard the session expired.
	gone bool
	// quiet: a probe found the session living; none is sent before then.
	quiet time.Time
}

// The connect request a handshake sends: its length, then the protocol
// version (4 bytes), lastZxidSeen (8), the session timeout (4), the
// session id (8) and the password. The answer: its length, then the
// protocol version, the session timeout and the session id, 0 when the
// session does not live.
const (
	helloZxid      = 8
	helloSession   = 20
	helloMin       = 28
	answerSession  = 12
	answerMinBytes = 20
)

// handshake takes p, the first write of a connection, and returns what
// to write instead: p, or p with lastZxidSeen zeroed once the session is
// known gone. It also returns the handshake to probe with should the
// server close the connection without an answer, nil when that cannot
// mean the server is behind the client (no session or no transaction
// seen, the session known gone, or a write that is not a whole connect
// request).
func (r *rollback) handshake(p []byte) (out, probe []byte) {
	if len(p) < helloMin || int(binary.BigEndian.Uint32(p)) != len(p)-4 {
		return p, nil
	}
	zxid, sid := p[helloZxid:helloZxid+8], p[helloSession:helloSession+8]
	if binary.BigEndian.Uint64(sid) == 0 || binary.BigEndian.Uint64(zxid) == 0 {
		return p, nil
	}
	probe = append([]byte(nil), p...)
	clear(probe[helloZxid : helloZxid+8])
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone {
		return probe, nil
	}
	return p, probe
}

// closed records that the server closed the connection of handshake probe
// without an answer.
func (r *rollback) closed(probe []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = probe
}

// expired records that the library heard its session expired, and so
// forgot the transaction id it had seen.
func (r *rollback) expired() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused, r.gone = nil, false
}

// check runs before a connection attempt to address: after a handshake
// closed without an answer, it asks the server at address whether the
// session lives, waiting at most the handshake's limit (see sniffConn), a
// sixth of sessionTimeout, unless a probe found the session living less
// than twice sessionTimeout ago.
func (r *rollback) check(network, address string, sessionTimeout time.Duration) {
	r.mu.Lock()
	probe := r.refused
	r.refused = nil
	quiet := time.Now().Before(r.quiet)
	r.mu.Unlock()
	if probe == nil || quiet {
		return
	}
	gone, err := sessionGone(network, address, probe, sessionTimeout/6)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if gone {
		r.gone = true
	} else {
		r.quiet = time.Now().Add(2 * sessionTimeout)
	}
}

// sessionGone sends handshake to the server at address on a connection of
// its own, and reports whether the server answered that its session does
// not live. An error says the server did not answer.
func sessionGone(network, address string, handshake []byte, limit time.Duration) (bool, error) {
	c, err := net.DialTimeout(network, address, limit)
	if err != nil {
		return false, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(limit))
	if _, err := c.Write(handshake); err != nil {
		return false, err
	}
	var head [answerMinBytes]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return false, err
	}
	if int(binary.BigEndian.Uint32(head[:])) < answerMinBytes-4 {
		return false, errors.New("short connect response")
	}
	return binary.BigEndian.Uint64(head[answerSession:]) == 0, nil
}

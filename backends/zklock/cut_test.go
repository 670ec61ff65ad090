package zklock

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// cutProxy forwards connections to a ZooKeeper server and, once armed,
// swallows the next answer to a request (a frame with a positive xid) and
// closes the connection instead: the server applied the request, and the
// client never hears of it.
//
// Frozen, it accepts connections and sends nothing either way, as a frozen
// server does. It closes, unanswered, the next turnAway handshakes, as a
// server not yet serving does, and the next behind handshakes that carry a
// transaction id (lastZxidSeen), as a server behind the client does. It
// counts the connections that resumed a session without a transaction id
// and went on after their handshake (blind): a client library's, which the
// server may then answer from data older than the client saw. With
// refuseAuth, it answers the credentials of every connection with
// AUTH_FAILED and closes it, as a server without their provider does.
type cutProxy struct {
	addr       string
	target     string
	armed      atomic.Bool
	refuseAuth atomic.Bool
	cuts       atomic.Int32
	frozen     atomic.Bool
	held       atomic.Int32 // connections accepted while frozen
	// handshakes to close unanswered: any, and those with a lastZxidSeen
	turnAway, behind atomic.Int32
	blind            atomic.Int32
	accepted         atomic.Int32 // connections from clients
	mu               sync.Mutex
	conns            []net.Conn
}

// kick closes every connection relayed so far.
func (p *cutProxy) kick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), target: target}
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			if p.frozen.Load() {
				p.held.Add(1)
				p.mu.Lock()
				p.conns = append(p.conns, c)
				p.mu.Unlock()
				continue
			}
			go p.relay(c)
		}
	}()
	return p
}

// relay reads c's handshake and forwards c to the target, unless the
// handshake is to be turned away.
func (p *cutProxy) relay(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	var head [4]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		c.Close()
		return
	}
	hello := make([]byte, 4+binary.BigEndian.Uint32(head[:]))
	copy(hello, head[:])
	if _, err := io.ReadFull(c, hello[4:]); err != nil {
		c.Close()
		return
	}
	zxid := len(hello) >= 16 && binary.BigEndian.Uint64(hello[8:16]) != 0
	if takeOne(&p.turnAway) || zxid && takeOne(&p.behind) {
		c.Close()
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, s)
	p.mu.Unlock()
	if _, err := s.Write(hello); err != nil {
		c.Close()
		s.Close()
		return
	}
	blind := !zxid && len(hello) >= 28 && binary.BigEndian.Uint64(hello[20:28]) != 0
	go func() {
		if blind {
			var b [1]byte
			if n, _ := c.Read(b[:]); n > 0 {
				p.blind.Add(1)
				s.Write(b[:])
			}
		}
		io.Copy(s, c)
		s.Close()
	}()
	p.answers(c, s)
}

// takeOne takes one from n, reporting false when it was 0.
func takeOne(n *atomic.Int32) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// answers copies the server's frames to the client, the first of them (the
// connect response, which has no xid) unread.
func (p *cutProxy) answers(c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	first := true
	var head [8]byte
	for {
		if _, err := io.ReadFull(s, head[:4]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(head[:4])
		frame := make([]byte, 4+n)
		copy(frame, head[:4])
		if _, err := io.ReadFull(s, frame[4:]); err != nil {
			return
		}
		if !first && n >= 4 && int32(binary.BigEndian.Uint32(frame[4:8])) > 0 && p.armed.CompareAndSwap(true, false) {
			p.cuts.Add(1)
			return
		}
		if !first && n >= replyHeader && int32(binary.BigEndian.Uint32(frame[4:8])) == authXid && p.refuseAuth.Load() {
			code := int32(authFailCode)
			binary.BigEndian.PutUint32(frame[4+12:], uint32(code))
			c.Write(frame)
			return
		}
		first = false
		if _, err := c.Write(frame); err != nil {
			return
		}
	}
}

// TestLostCreateAnswer: the create of a contender node is applied but its
// answer is lost with the connection (ZooKeeper's "protected create"
// problem). The node must not stay behind as a ghost that queues everyone
// behind it until the session ends: the contender finds it by its GUID and
// holds on it, or, not waiting for a held lock, deletes it.
func TestLostCreateAnswer(t *testing.T) {
	srv := servers(t)
	p := startCutProxy(t, srv[0])
	l := dial(t, []string{p.addr})
	other := dial(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	k := testKey(t)
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// The parent made first, so that the answer cut is the create's, not
	// its "no node".
	if err := other.makeParent(l.lockPath(k)); err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	held, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatalf("Acquire through a lost create answer: %v", err)
	}
	if p.cuts.Load() != 1 {
		t.Fatalf("%d answers cut, want the create's", p.cuts.Load())
	}
	if names := children(t, other, k); len(names) != 1 || k == "" || l.lockPath(k)+"/"+names[0] != held.(*lease).node {
		t.Fatalf("queue %q, want the holder's node %s alone", names, held.(*lease).node)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := other.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatalf("the lock after the release: %v", err)
	}
	if next.Token() <= held.Token() {
		t.Errorf("token %d after %d", next.Token(), held.Token())
	}

	// Held by other: a contender that does not wait, whose create's answer
	// is lost, leaves no node behind.
	p.armed.Store(true)
	_, err = l.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire of a held lock through a lost create answer: %v, want ErrNotAcquired", err)
	}
	eventually(t, "the holder's node alone in the queue", func() bool { return len(children(t, other, k)) == 1 })
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStoreLostAnswers: a Claim whose create was applied but whose answer
// was lost recognises its own record and holds the claim, and a Complete
// whose answer was lost has completed the record all the same.
func TestStoreLostAnswers(t *testing.T) {
	srv := servers(t)
	p := startCutProxy(t, srv[0])
	s := newTestStore(t, []string{p.addr})
	other := newTestStore(t, srv)
	ctx := testCtx(t)
	key := testKey(t)
	// The bucket made first, so that the answer cut is the claim's create,
	// not its "no node".
	bucket, _ := s.place("", key)
	if err := s.ensure(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	rec, err := s.Claim(ctx, idempotency.Claim{Key: key, Fingerprint: "fp", Owner: "a", Lease: time.Minute})
	if err != nil || rec != nil {
		t.Fatalf("Claim through a lost answer: %v, %v; want the claim", rec, err)
	}
	if p.cuts.Load() != 1 {
		t.Fatalf("%d answers cut, want 1", p.cuts.Load())
	}
	rec, err = other.Claim(ctx, idempotency.Claim{Key: key, Fingerprint: "fp", Owner: "b", Lease: time.Minute})
	if err != nil || rec == nil || rec.Owner != "a" {
		t.Fatalf("another owner's Claim: %+v, %v; want a's claim", rec, err)
	}
}

// TestFrozenServerAfterShorterGrant: a Locker that asked for a longer
// session than the server grants gives up a connection attempt to a frozen
// server, and waits before trying it again, by the granted timeout, not
// the one asked for: it reconnects once the server thaws, before its
// lease is declared lost, where a handshake allowed a sixth of the asked
// timeout outlived the session.
func TestFrozenServerAfterShorterGrant(t *testing.T) {
	const granted = 12 * time.Second
	s := startServerUpTo(t, granted)
	p := startCutProxy(t, s.addr)
	l := dial(t, []string{p.addr}, WithSessionTimeout(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Waiting: a JVM just started may turn the first connection away.
	held, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: granted, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	if got := l.sessionTimeout(); got != granted {
		t.Fatalf("session timeout %v, want the %v granted", got, granted)
	}
	p.frozen.Store(true)
	p.kick()
	frozen := time.Now()
	eventually(t, "a connection attempt to the frozen server", func() bool { return p.held.Load() > 0 })
	p.frozen.Store(false)
	eventually(t, "connected again, or the lease lost", func() bool {
		up, _ := l.hosts.link()
		return closed(up) || closed(sessionDone(held))
	})
	if closed(sessionDone(held)) {
		t.Fatal("the lease was lost before the Locker reconnected to the thawed server")
	}
	t.Logf("connected again %v after the server froze (session %v)", time.Since(frozen), granted)
}

package drivertest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP relay between a client and a server that a fault test can
// cut, as a network partition would: the client sees its connection stall
// (Blackhole) or drop, and cannot connect again (Cut), while the server
// keeps running (and keeps the client's session until it expires); or the
// partition heals (Reset) and the client must reconnect.
type Proxy struct {
	ln       net.Listener
	upstream string

	holed atomic.Bool  // bytes are dropped, connections kept: a silent partition
	deaf  atomic.Bool  // the server's bytes are dropped, the client's still relayed
	slow  atomic.Int64 // the server's bytes are held back this long (ns)
	late  atomic.Int64 // the client's bytes are held back this long (ns)

	mu    sync.Mutex
	conns map[net.Conn]bool
	cut   bool
}

// StartProxy relays connections made to its Addr to upstream until Cut,
// which t's cleanup calls.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(p.Cut)
	return p
}

// Addr is the address clients connect to instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.relayConn(c)
	}
}

func (p *Proxy) relayConn(c net.Conn) {
	u, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
	if err != nil {
		abort(c)
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		abort(c)
		abort(u)
		return
	}
	p.conns[c], p.conns[u] = true, true
	p.mu.Unlock()
	go p.relay(u, c, false)
	p.relay(c, u, true)
}

// relay copies src to dst; fromServer says which way, for LoseReplies.
func (p *Proxy) relay(dst, src net.Conn, fromServer bool) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
		dst.Close()
		src.Close()
	}()
	// Bytes go out in order, each chunk no earlier than its arrival plus
	// the delay asked for then: Slow's for the server's, SlowRequests's
	// for the client's.
	delay := &p.late
	if fromServer {
		delay = &p.slow
	}
	type chunk struct {
		due time.Time
		b   []byte
	}
	q := make(chan chunk, 1024)
	drained := make(chan struct{})
	defer func() {
		close(q)
		if !fromServer {
			// The client's bytes held back when it closes still go,
			// before the close, as TCP delivers a segment sent again;
			// the server's are dropped (see Slow).
			<-drained
		}
	}()
	var failed atomic.Bool // a write to dst failed: the relay ends
	go func() {
		defer close(drained)
		for c := range q {
			time.Sleep(time.Until(c.due))
			if !failed.Load() {
				if _, err := dst.Write(c.b); err != nil {
					failed.Store(true)
				}
			}
		}
	}()
	write := func(b []byte) error {
		if failed.Load() {
			return net.ErrClosed
		}
		q <- chunk{time.Now().Add(time.Duration(delay.Load())), append([]byte(nil), b...)}
		return nil
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.holed.Load() && !(fromServer && p.deaf.Load()) {
			if err := write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// abort closes c with a reset rather than an orderly FIN.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// Blackhole drops every byte from now on, in both directions and on new
// connections too, but keeps the connections open: neither side learns of
// the partition but by silence.
func (p *Proxy) Blackhole() { p.holed.Store(true) }

// LoseReplies drops every byte the server sends from now on, on every
// connection, new ones too, while the client's bytes still reach it: a
// server that went silent without closing its connections, as far as its
// client can tell, though it still acts on what it is sent.
func (p *Proxy) LoseReplies() { p.deaf.Store(true) }

// Slow holds back every byte the server sends from now on by d, on every
// connection: a server that answers, late, as one under load does. Bytes
// still held back when a connection closes are dropped.
func (p *Proxy) Slow(d time.Duration) { p.slow.Store(int64(d)) }

// SlowRequests holds back every byte clients send from now on by d, on
// every connection: a request held up on its way, as a lost TCP segment
// sent again 200ms or more later is, while what is sent on other
// connections after it is not (SlowRequests(0) again). Bytes held back
// when the client closes its connection still reach the server, before
// the close.
func (p *Proxy) SlowRequests(d time.Duration) { p.late.Store(int64(d)) }

// Reset heals a Blackhole or LoseReplies as a partition heals, and ends
// Slow and SlowRequests: every relayed connection is torn down with a TCP
// reset, and new ones are relayed again.
func (p *Proxy) Reset() {
	p.mu.Lock()
	for c := range p.conns {
		abort(c)
	}
	clear(p.conns)
	p.mu.Unlock()
	p.holed.Store(false)
	p.deaf.Store(false)
	p.slow.Store(0)
	p.late.Store(0)
}

// Down takes the server away for good, as a stopped server whose port is
// closed: the listener is closed, so that connecting is refused, and every
// relayed connection is torn down with a TCP reset, which fails the
// client's next write on it with nothing written.
func (p *Proxy) Down() { p.shut(abort) }

// Cut closes the listener and every relayed connection, for good.
func (p *Proxy) Cut() { p.shut(func(c net.Conn) { c.Close() }) }

func (p *Proxy) shut(closeConn func(net.Conn)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	p.cut = true
	p.ln.Close()
	for c := range p.conns {
		closeConn(c)
	}
}

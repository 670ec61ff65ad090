//go:build faults

package faults

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy relays one client's connections to a server, and can partition
// them: Blackhole drops every byte while keeping the connections open, as a
// silent network partition does; Reset then tears every connection down
// with a TCP reset and relays again, as when the partition heals and the
// client must reconnect. Unlike drivertest.Proxy, whose Cut is for good, it
// heals, so the test can see the cut-off client come back.
type proxy struct {
	ln       net.Listener
	upstream string
	holed    atomic.Bool

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
}

func startProxy(upstream string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.relayConn(c)
	}
}

func (p *proxy) relayConn(c net.Conn) {
	u, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
	if err != nil {
		abort(c)
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		abort(c)
		abort(u)
		return
	}
	p.conns[c], p.conns[u] = true, true
	p.mu.Unlock()
	go p.pipe(u, c)
	p.pipe(c, u)
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.holed.Load() {
			if _, err := dst.Write(buf[:n]); err != nil {
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

// blackhole drops every byte from now on, both ways, new connections
// included; neither side learns of it but by silence.
func (p *proxy) blackhole() { p.holed.Store(true) }

// reset resets every connection, then relays again.
func (p *proxy) reset() {
	p.mu.Lock()
	for c := range p.conns {
		abort(c)
	}
	clear(p.conns)
	p.mu.Unlock()
	p.holed.Store(false)
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		abort(c)
	}
	p.mu.Unlock()
	p.ln.Close()
}

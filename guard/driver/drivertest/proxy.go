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
// or drop, and cannot connect again, while the server keeps running (and
// keeps the client's session until it expires).
type Proxy struct {
	ln       net.Listener
	upstream string

	holed atomic.Bool // bytes are dropped, connections kept: a silent partition

	mu    sync.Mutex
	conns []net.Conn
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
	p := &Proxy{ln: ln, upstream: upstream}
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
		u, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			u.Close()
			return
		}
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go p.relay(c, u)
		go p.relay(u, c)
	}
}

func (p *Proxy) relay(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
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

// Blackhole drops every byte from now on, in both directions, but keeps the
// connections open: neither side learns of the partition but by silence.
func (p *Proxy) Blackhole() { p.holed.Store(true) }

// Cut closes the listener and every relayed connection, for good.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

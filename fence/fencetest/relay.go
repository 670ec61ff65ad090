package fencetest

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// relay forwards TCP connections to a server and, when armed, aborts the
// connection that carries the server's nth next chunk of bytes instead of
// delivering it: the request may have been applied, its reply is lost.
// (drivertest.Proxy cuts every connection at once, on the test's clock; this
// one cuts on the server's reply, so that "applied, reply lost" happens.)
type relay struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	skip    atomic.Int64 // chunks to let through before cutting
	cuts    atomic.Int64
	chunks  atomic.Int64 // relayed from servers to clients
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	stopped bool
}

func startRelay(t testing.TB, target string) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go r.serve()
	t.Cleanup(r.stop)
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) cutAfter(n int) { r.skip.Store(int64(n)); r.armed.Store(true) }

func (r *relay) disarm() { r.armed.Store(false) }

func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relay) stop() {
	r.ln.Close()
	r.mu.Lock()
	r.stopped = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
}

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.pipe(c)
	}
}

func (r *relay) pipe(client net.Conn) {
	server, err := net.Dial("tcp", r.target)
	if err != nil {
		client.Close()
		return
	}
	if !r.track(client) || !r.track(server) {
		client.Close()
		server.Close()
		return
	}
	go func() {
		io.Copy(server, client)
		server.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			r.chunks.Add(1)
			if r.armed.Load() && r.skip.Add(-1) < 0 && r.armed.CompareAndSwap(true, false) {
				r.cuts.Add(1)
				abort(client)
				server.Close()
				return
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				abort(client)
			} else {
				client.Close()
			}
			server.Close()
			return
		}
	}
}

// abort closes c with a reset, as a cut network path looks to the client.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

package zookeeper

import (
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/backends/backendtest"
)

// testSession is the session timeout, hence the lease TTL, of the tests: the
// shortest the test servers allow (minSessionTimeout is 2 ticks of 500ms)
// with room for a busy machine.
const testSession = 2 * time.Second

// testRoot keeps the tests' nodes apart from anything else on the server.
const testRoot = "/warden-test/locks"

func servers(t testing.TB) []string {
	t.Helper()
	return strings.Split(backendtest.Addr(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181"), ",")
}

type discard struct{}

func (discard) Printf(string, ...any) {}

// dial returns a Locker closed at the end of the test. Connection errors are
// expected in the fault tests, so the client library's log is dropped.
func dial(t testing.TB, addrs []string, opts ...Option) *Locker {
	t.Helper()
	l, err := Dial(addrs, testSession, append([]Option{WithRoot(testRoot), WithLogger(discard{})}, opts...)...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// waiters counts the contenders queued on key's lock that do not hold it.
func waiters(t testing.TB, l *Locker, key string) int {
	t.Helper()
	names, _, err := l.conn.Children(l.lockPath(key))
	if errors.Is(err, zk.ErrNoNode) {
		return 0
	}
	if err != nil {
		t.Fatalf("Children: %v", err)
	}
	q := queue(names)
	n := 0
	for i := range q {
		if holds, _, _ := decide(q, i, 1); !holds {
			n++
		}
	}
	return n
}

// proxy is a TCP relay between a client and a server that a test can cut,
// as a network partition would: the client sees its connection stall or
// drop, and cannot connect again, while the server keeps running.
type proxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func startProxy(t testing.TB, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	p := &proxy{ln: ln, upstream: upstream}
	go p.serve()
	t.Cleanup(p.Cut)
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
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
		go relay(c, u)
		go relay(u, c)
	}
}

func relay(dst, src net.Conn) {
	io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// Cut closes the listener and every relayed connection, for good.
func (p *proxy) Cut() {
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

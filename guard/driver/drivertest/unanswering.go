package drivertest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Unanswering returns a loopback host:port that accepts every connection
// and never answers, as a hung server does (or a stopped one, whose kernel
// still completes handshakes), and the count of connections it accepted.
// The connections are closed when the test ends.
func Unanswering(t testing.TB) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("unanswering address: %v", err)
	}
	accepted = new(atomic.Int64)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			accepted.Add(1)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), accepted
}

package drivertest

import (
	"net"
	"testing"
)

// ClosedAddr returns a loopback host:port where nothing listens, so that
// connections to it are refused at once: a server that is down. (Another
// test may take the port later; a test that needs it closed for long
// should use a Proxy and Cut it instead.)
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("closed address: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

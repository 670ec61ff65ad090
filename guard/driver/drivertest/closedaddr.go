package drivertest

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/warden-go/warden/guard/driver"
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

// WantUnreached fails t unless err, that of a waiting acquisition whose
// context's deadline ended it while the backend could not be reached (what
// says which), is the deadline carrying the last attempt's failure, as
// driver.Unreached makes it.
func WantUnreached(t testing.TB, what string, err error) {
	t.Helper()
	var u *driver.UnreachedError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &u) || !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("%s: %v, want the deadline carrying the last failure", what, err)
	}
}

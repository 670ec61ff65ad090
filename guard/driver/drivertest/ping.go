package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// CheckPing checks a backend's Ping (a Locker's or a store's): up, a client
// of a live server, answers nil; cut, a client whose server stopped
// answering (through a Proxy after Blackhole), returns an error wrapping
// ErrUnavailable, or ctx's deadline error, within the deadline and a
// second, whatever the client's own timeouts.
func CheckPing(t *testing.T, up, cut driver.Pinger) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := up.Ping(ctx); err != nil {
		t.Fatalf("Ping of a live server: %v", err)
	}
	const bound = time.Second
	ctx, cancel = context.WithTimeout(context.Background(), bound)
	defer cancel()
	start := time.Now()
	err := cut.Ping(ctx)
	took := time.Since(start)
	if !errors.Is(err, driver.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ping of a server that does not answer: %v, want ErrUnavailable or the deadline", err)
	}
	if took > bound+time.Second {
		t.Fatalf("Ping of a server that does not answer took %v with a %v deadline", took, bound)
	}
}

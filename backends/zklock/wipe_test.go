package zklock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// wipedHolder starts a server of the test's own, has a Locker hold a lock
// on it after a few acquisitions, then restarts the server with its data
// directory emptied, as a server that lost its disk. It returns the server,
// the Locker, its lease and when the server served again.
func wipedHolder(t *testing.T) (*zkServer, *Locker, driver.Lease, time.Time) {
	t.Helper()
	s := startServer(t)
	l := dial(t, []string{s.addr})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var held driver.Lease
	for range 20 {
		if held != nil {
			held.Release(ctx)
		}
		var err error
		// Waiting: a JVM just started may turn the first connection away.
		if held, err = l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession, Wait: true}); err != nil {
			t.Fatal(err)
		}
	}
	s.restart(t, true)
	return s, l, held, time.Now()
}

// TestWipedServer: a server that comes back without its data has no
// session and no lock: the holder's lease is declared lost (its session's
// Done), and the czxid tokens start over, below the ones given before, as
// the README's failure table says.
func TestWipedServer(t *testing.T) {
	s, _, held, back := wipedHolder(t)
	select {
	case <-sessionDone(held):
		t.Logf("the holder's session was declared lost %v after the server served again", time.Since(back))
	case <-time.After(30 * time.Second):
		t.Fatal("the lease of a wiped server was not declared lost")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	next, err := dial(t, []string{s.addr}).Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() >= held.Token() {
		t.Errorf("token %d from a wiped server, after %d: the README says tokens start over", next.Token(), held.Token())
	}
}

// TestWipedServerLockerReconnects: a Locker whose server lost its data is
// usable again once the server is back.
func TestWipedServerLockerReconnects(t *testing.T) {
	t.Skip("defect: a Locker that had a session never connects again to a server that lost its data: " +
		"the server refuses a client that has seen a later transaction than its own last one, " +
		"and the client library keeps that transaction id until a server says its session expired")
	_, l, _, _ := wipedHolder(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatalf("Acquire on the Locker after its server lost its data: %v", err)
	}
	lease.Release(ctx)
}

package zklock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
	held := acquisitions(t, l, 20)
	s.restart(t, true)
	return s, l, held, time.Now()
}

// acquisitions acquires the lock "k" on l n times, releasing each lease
// but the last, which it returns.
func acquisitions(t *testing.T, l *Locker, n int) driver.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var held driver.Lease
	for range n {
		if held != nil {
			held.Release(ctx)
		}
		var err error
		// Waiting: a JVM just started may turn the first connection away.
		if held, err = l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession, Wait: true}); err != nil {
			t.Fatal(err)
		}
	}
	return held
}

// acquireAgain acquires "k" on l, whose server lost held's session, and
// checks that the grant is on a new session and came after held was
// declared lost.
func acquireAgain(t *testing.T, l *Locker, held driver.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	next, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatalf("Acquire on the Locker after its server lost the session: %v", err)
	}
	defer next.Release(ctx)
	if !closed(sessionDone(held)) {
		t.Error("granted on the new session while the old session's lease was not declared lost")
	}
	if old, now := held.(*lease).ep.session, next.(*lease).ep.session; now == old {
		t.Errorf("the new lease is on session %#x, the old one", now)
	}
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
// usable again once the server is back, on a new session, and the lease it
// held on the old one was declared lost before the new grant.
func TestWipedServerLockerReconnects(t *testing.T) {
	_, l, held, _ := wipedHolder(t)
	acquireAgain(t, l, held)
}

// heldThroughProxy has a Locker of a long session, through a proxy to a
// server of the test's own, hold a lock.
func heldThroughProxy(t *testing.T) (*zkServer, *cutProxy, *Locker, driver.Lease) {
	t.Helper()
	s := startServer(t)
	p := startCutProxy(t, s.addr)
	// A session long enough for the holder to outlive a restart.
	l := dial(t, []string{p.addr}, WithSessionTimeout(40*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Waiting: a JVM just started may turn the first connection away.
	held, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	return s, p, l, held
}

// keptSession checks that held, granted on session sid of l through p,
// outlived a fault: its node is still there and its session's, it was
// never declared lost, and the session was taken up again with the
// transaction id the client had seen.
func keptSession(t *testing.T, p *cutProxy, l *Locker, held driver.Lease, sid int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := held.Refresh(ctx, testSession)
		if err == nil {
			break
		}
		// Calls made before the Locker is connected again fail as an
		// outage.
		if !errors.Is(err, driver.ErrUnavailable) || ctx.Err() != nil {
			t.Fatalf("Refresh after the fault: %v", err)
		}
	}
	if closed(sessionDone(held)) {
		t.Fatal("the holder's session was declared lost over a fault shorter than it")
	}
	if got := l.conn.SessionID(); got != sid {
		t.Errorf("session %#x after the fault, want %#x, the one before", got, sid)
	}
	if n := p.blind.Load(); n > 0 {
		t.Errorf("%d connections took the live session up without the transaction id the client had seen", n)
	}
}

// TestRestartedServerKeepsSession: a server stopped and started again with
// its data (an outage, not a wipe), which closes handshakes unanswered
// until it serves, leaves the Locker its session and its holder.
func TestRestartedServerKeepsSession(t *testing.T) {
	s, p, l, held := heldThroughProxy(t)
	sid := l.conn.SessionID()
	const turnedAway = 6
	p.turnAway.Store(turnedAway)
	s.restart(t, false)
	keptSession(t, p, l, held, sid)
	if left := p.turnAway.Load(); left != 0 {
		t.Errorf("%d of the %d handshakes to turn away were not sent", left, turnedAway)
	}
}

// TestServerBehindKeepsSession: a server behind the client (a follower
// catching up) closes handshakes that carry a later transaction id than
// its own unanswered, as a server that lost its data does, but the session
// lives: the Locker keeps it, and its holder.
func TestServerBehindKeepsSession(t *testing.T) {
	_, p, l, held := heldThroughProxy(t)
	sid := l.conn.SessionID()
	const behind = 4
	p.behind.Store(behind)
	p.kick()
	keptSession(t, p, l, held, sid)
	if left := p.behind.Load(); left != 0 {
		t.Errorf("%d of the %d handshakes to turn away were not sent", left, behind)
	}
}

// TestRestoredServerLockerReconnects: a server restored from a copy of its
// data taken while the Locker's session lived knows that session, but not
// the Locker's later transactions, so it turns the Locker's handshakes away
// until the session expires. The Locker's probes must not keep the session
// alive: it connects again, on a new session, once the server expired the
// old one.
func TestRestoredServerLockerReconnects(t *testing.T) {
	s := startServer(t)
	l := dial(t, []string{s.addr})
	acquisitions(t, l, 1).Release(context.Background())
	backup := filepath.Join(t.TempDir(), "data")
	if err := os.CopyFS(backup, os.DirFS(s.data)); err != nil {
		t.Fatal(err)
	}
	held := acquisitions(t, l, 10)
	s.Kill()
	if err := os.RemoveAll(s.data); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, s.data); err != nil {
		t.Fatal(err)
	}
	s.startAgain(t)
	back := time.Now()
	acquireAgain(t, l, held)
	t.Logf("granted %v after the restored server served", time.Since(back))
}

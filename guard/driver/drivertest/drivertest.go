// Package drivertest is the conformance suite every warden lock backend runs
// from its own tests, against the real server it talks to, with the helpers
// those tests share (test server addresses, a TCP fault proxy, a redis-server
// of a test's own). A backend is done when it passes.
//
//	func TestConformance(t *testing.T) {
//		drivertest.Run(t, drivertest.Backend{
//			NewLocker: func(t testing.TB) driver.Locker { ... },
//		})
//	}
//
// The suite exercises only the driver.Locker contract (and the optional
// capabilities the backend implements, found by type assertion): mutual
// exclusion under contention proven by fencing tokens, token monotonicity,
// expiry of a vanished holder, conservative Expiry, refresh, owner-checked
// refresh and release,
// waiting that wakes on release, cancellation that leaves nothing behind, FIFO
// order where claimed, read/write and semaphore semantics where offered,
// keys that differ only in trailing spaces, case or Unicode normalisation
// kept apart, a release after the Locker's Close that returns at once, and,
// given Backend.Silence, the bound on every call that a Locker declaring
// driver.ContextBounded or driver.DeadlineBounded promises, against a server
// gone silent.
//
// Every wait in the suite is a deadline on a condition, never a fixed sleep
// whose length decides the outcome, so it holds on slow, shared machines.
package drivertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// Backend describes the backend under test.
type Backend struct {
	// NewLocker returns a new client of the backend, as independent of the
	// others as a separate process would be (its own connection, its own
	// session). Register any cleanup with t.Cleanup.
	NewLocker func(t testing.TB) driver.Locker

	// TTL is the lease TTL the suite uses. It should be short, because the
	// expiry tests wait for it, but no shorter than the backend honours.
	// Default 500ms.
	TTL time.Duration

	// Abandon makes l stop as a crashed process would: no more renewals,
	// nothing released. Backends whose leases stay alive only through
	// explicit Refresh calls can leave it nil; backends that renew a session
	// in the background (etcd, ZooKeeper) must stop that renewal.
	Abandon func(t testing.TB, l driver.Locker)

	// FIFO claims first-come, first-served handoff for waiters that asked
	// for it with AcquireOptions.Fair. It requires Waiters.
	FIFO bool

	// Waiters reports how many contenders are waiting for key, not counting
	// the holders. The suite
	// uses it to know a waiter is enqueued before it starts the next one,
	// rather than sleeping and hoping. Needed by the FIFO and writer
	// preference tests, which are skipped without it.
	Waiters func(t testing.TB, key string) int

	// Silence returns a new client of the backend, as NewLocker does, and
	// a func that makes its server go silent for it: connections stay open
	// and nothing gets through them any more (see Proxy.Blackhole). The
	// suite then checks the promise of driver.ContextBounded or
	// driver.DeadlineBounded when the Locker makes it; that test is skipped
	// without Silence.
	Silence func(t testing.TB) (l driver.Locker, silence func())
}

func (b *Backend) ttl() time.Duration {
	if b.TTL > 0 {
		return b.TTL
	}
	return 500 * time.Millisecond
}

// patience bounds every wait on a condition: far longer than any correct
// backend needs, so reaching it means the behaviour is wrong, not slow.
func (b *Backend) patience() time.Duration { return 20*b.ttl() + 10*time.Second }

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, b Backend) {
	if b.NewLocker == nil {
		t.Fatal("drivertest: Backend.NewLocker is nil")
	}
	t.Run("TryWhenHeld", func(t *testing.T) { testTryWhenHeld(t, &b) })
	t.Run("TokensIncrease", func(t *testing.T) { testTokensIncrease(t, &b) })
	t.Run("MutualExclusion", func(t *testing.T) { testMutualExclusion(t, &b) })
	t.Run("ExpiryWhenHolderVanishes", func(t *testing.T) { testExpiry(t, &b) })
	t.Run("RefreshExtends", func(t *testing.T) { testRefreshExtends(t, &b) })
	t.Run("StaleLease", func(t *testing.T) { testStaleLease(t, &b) })
	t.Run("ExpiryIsConservative", func(t *testing.T) { testExpiryIsConservative(t, &b) })
	t.Run("WaitWakesOnRelease", func(t *testing.T) { testWaitWakes(t, &b) })
	t.Run("CancelWhileWaiting", func(t *testing.T) { testCancelWhileWaiting(t, &b) })
	t.Run("FIFO", func(t *testing.T) { testFIFO(t, &b) })
	t.Run("ReadWrite", func(t *testing.T) { testReadWrite(t, &b) })
	t.Run("Semaphore", func(t *testing.T) { testSemaphore(t, &b) })
	t.Run("Inspect", func(t *testing.T) { testInspect(t, &b) })
	t.Run("List", func(t *testing.T) { testList(t, &b) })
	t.Run("ForceRelease", func(t *testing.T) { testForceRelease(t, &b) })
	t.Run("DistinctKeys", func(t *testing.T) { testDistinctKeys(t, &b) })
	t.Run("ReleaseAfterClose", func(t *testing.T) { testReleaseAfterClose(t, &b) })
	t.Run("BoundedCalls", func(t *testing.T) { testBoundedCalls(t, &b) })
	t.Run("LongestTTL", func(t *testing.T) { testLongestTTL(t, &b) })
}

var keySeq atomic.Int64

// key returns a key no earlier test (in this process or a previous run
// against the same server) has used.
func key(t testing.TB) string {
	return fmt.Sprintf("conformance/%s/%d-%d", t.Name(), time.Now().UnixNano(), keySeq.Add(1))
}

func (b *Backend) opts(wait bool) driver.AcquireOptions {
	return driver.AcquireOptions{TTL: b.ttl(), Wait: wait}
}

// held is opts for a test whose locks must stay held while it looks at
// them, and whose subject is not expiry: with the suite's short TTL, a
// test descheduled for half a second on a loaded machine would otherwise
// see its own lock lapse and report the lapse as the backend's fault.
func (b *Backend) held(wait bool) driver.AcquireOptions {
	return driver.AcquireOptions{TTL: 20 * b.ttl(), Wait: wait}
}

func (b *Backend) ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), b.patience())
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t testing.TB, l driver.Locker, ctx context.Context, k string, o driver.AcquireOptions) driver.Lease {
	t.Helper()
	lease, err := l.Acquire(ctx, k, o)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", k, err)
	}
	if lease == nil {
		t.Fatalf("Acquire(%q) returned a nil lease and no error", k)
	}
	return lease
}

func release(t testing.TB, lease driver.Lease) {
	t.Helper()
	if err := lease.Release(context.Background()); err != nil {
		t.Errorf("Release(token %d): %v", lease.Token(), err)
	}
}

func expectNotAcquired(t testing.TB, l driver.Locker, ctx context.Context, k string, o driver.AcquireOptions) {
	t.Helper()
	lease, err := l.Acquire(ctx, k, o)
	if err == nil {
		lease.Release(context.Background())
		t.Fatalf("Acquire(%q) succeeded while the lock was held elsewhere", k)
	}
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire(%q) on a held lock: got %v, want ErrNotAcquired", k, err)
	}
}

// eventually polls cond until it is true or the suite's patience runs out.
func (b *Backend) eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(b.patience())
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", b.patience(), what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testTryWhenHeld(t *testing.T, b *Backend) {
	ctx := b.ctx(t)
	l1, l2 := b.NewLocker(t), b.NewLocker(t)
	k := key(t)
	lease := mustAcquire(t, l1, ctx, k, b.held(false))
	expectNotAcquired(t, l2, ctx, k, b.opts(false))
	expectNotAcquired(t, l1, ctx, k, b.opts(false)) // reentrancy is guard's business, not the backend's
	release(t, lease)
	release(t, mustAcquire(t, l2, ctx, k, b.opts(false)))
}

func testTokensIncrease(t *testing.T, b *Backend) {
	ctx := b.ctx(t)
	lockers := []driver.Locker{b.NewLocker(t), b.NewLocker(t)}
	k := key(t)
	var last uint64
	for i := range 20 {
		lease := mustAcquire(t, lockers[i%2], ctx, k, b.opts(false))
		if tok := lease.Token(); tok <= last {
			t.Fatalf("acquisition %d: token %d, not greater than the previous %d", i, tok, last)
		} else {
			last = tok
		}
		release(t, lease)
	}
	// A different key has its own lock: holding one must not block the other.
	other := mustAcquire(t, lockers[0], ctx, k+"-other", b.opts(false))
	again := mustAcquire(t, lockers[1], ctx, k, b.opts(false))
	if again.Token() <= last {
		t.Errorf("token went back from %d to %d", last, again.Token())
	}
	release(t, other)
	release(t, again)
}

// testMutualExclusion runs contenders on several clients; a fenced resource
// (it refuses a write whose token is not greater than the last accepted) and
// an occupancy counter prove no two held the lock at once.
func testMutualExclusion(t *testing.T, b *Backend) {
	const clients, perClient, rounds = 3, 3, 8
	ctx := b.ctx(t)
	k := key(t)
	var (
		inside   atomic.Int32
		mu       sync.Mutex
		lastTok  uint64
		sections int
		wg       sync.WaitGroup
	)
	errs := make(chan error, clients*perClient*rounds)
	for range clients {
		l := b.NewLocker(t)
		for range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					o := b.held(true)
					o.Fair = b.FIFO // a FIFO backend's fair path must exclude as well
					lease, err := l.Acquire(ctx, k, o)
					if err != nil {
						errs <- fmt.Errorf("acquire: %w", err)
						return
					}
					if n := inside.Add(1); n != 1 {
						errs <- fmt.Errorf("%d holders inside the critical section at once", n)
					}
					mu.Lock()
					if tok := lease.Token(); tok <= lastTok {
						errs <- fmt.Errorf("fenced write with token %d after token %d was accepted", tok, lastTok)
					} else {
						lastTok = tok
					}
					sections++
					mu.Unlock()
					time.Sleep(time.Millisecond)
					inside.Add(-1)
					if err := lease.Release(context.Background()); err != nil {
						errs <- fmt.Errorf("release: %w", err)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if want := clients * perClient * rounds; sections != want {
		t.Errorf("%d critical sections ran, want %d", sections, want)
	}
}

func testExpiry(t *testing.T, b *Backend) {
	ctx := b.ctx(t)
	holder, other := b.NewLocker(t), b.NewLocker(t)
	k := key(t)
	stale := mustAcquire(t, holder, ctx, k, b.opts(false))
	start := time.Now()
	if b.Abandon != nil {
		b.Abandon(t, holder)
	}
	expectNotAcquired(t, other, ctx, k, b.opts(false))

	// The new holder's lease must outlast the checks below, which are not
	// about its expiry.
	next := mustAcquire(t, other, ctx, k, b.held(true))
	// guard declares a lease lost by its Expiry: the server must not have
	// granted the lock to anyone before it.
	if granted := time.Now(); stale.Expiry().After(granted) {
		t.Errorf("the lock was granted to another owner %v before the stale lease's Expiry", stale.Expiry().Sub(granted))
	}
	if waited := time.Since(start); waited < b.ttl()/2 {
		t.Errorf("lock of a vanished holder was granted again after %v, before half its TTL %v", waited, b.ttl())
	}
	if next.Token() <= stale.Token() {
		t.Errorf("new holder's token %d is not greater than the expired holder's %d", next.Token(), stale.Token())
	}
	if b.Abandon == nil {
		// The stale lease must know it is stale, and must not touch the new
		// holder's lock.
		if err := stale.Refresh(ctx, b.ttl()); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Refresh of an expired, taken-over lease: got %v, want ErrNotHeld", err)
		}
		if err := stale.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release of an expired, taken-over lease: got %v, want ErrNotHeld", err)
		}
	} else {
		// The abandoned client must learn that its lease is gone, through
		// its session or through Refresh: that is what lets guard cancel the
		// work the lease guarded.
		b.eventually(t, "the abandoned lease reports its loss", func() bool {
			if sl, ok := stale.(driver.SessionLease); ok {
				select {
				case <-sl.Session().Done():
					return true
				default:
				}
				return !time.Now().Before(stale.Expiry())
			}
			rctx, cancel := context.WithTimeout(ctx, b.ttl())
			defer cancel()
			return errors.Is(stale.Refresh(rctx, b.ttl()), driver.ErrNotHeld)
		})
	}
	expectNotAcquired(t, b.NewLocker(t), ctx, k, b.opts(false))
	release(t, next)
}

func testRefreshExtends(t *testing.T, b *Backend) {
	ctx := b.ctx(t)
	holder, other := b.NewLocker(t), b.NewLocker(t)
	k := key(t)
	lease := mustAcquire(t, holder, ctx, k, b.opts(false))
	// Keep the lease alive for three TTLs by refreshing at a third of it; a
	// refresh that did not extend would let the other client in.
	end := time.Now().Add(3 * b.ttl())
	for time.Now().Before(end) {
		time.Sleep(b.ttl() / 3)
		if err := lease.Refresh(ctx, b.ttl()); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		expectNotAcquired(t, other, ctx, k, b.opts(false))
	}
	release(t, lease)
	release(t, mustAcquire(t, other, ctx, k, b.opts(false)))
}

// testStaleLease checks that a lease released and taken by another owner
// can no longer be refreshed: refresh is owner-checked.
func testStaleLease(t *testing.T, b *Backend) {
	ctx := b.ctx(t)
	l1, l2 := b.NewLocker(t), b.NewLocker(t)
	k := key(t)
	lease := mustAcquire(t, l1, ctx, k, b.opts(false))
	release(t, lease)
	next := mustAcquire(t, l2, ctx, k, b.opts(false))
	if _, session := lease.(driver.SessionLease); !session {
		if err := lease.Refresh(ctx, b.ttl()); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Refresh of a released lease now held by another owner: got %v, want ErrNotHeld", err)
		}
	}
	expectNotAcquired(t, l1, ctx, k, b.opts(false))
	release(t, next)
}

// testExpiryIsConservative checks Lease.Expiry, which guard declares losses
// by: never later than the send time of the granting or renewing request
// plus the TTL, and not absurdly early either.
func testExpiryIsConservative(t *testing.T, b *Backend) {
	ctx := b.ctx(t)
	l := b.NewLocker(t)
	k := key(t)
	ttl := b.ttl()
	before := time.Now()
	lease := mustAcquire(t, l, ctx, k, b.opts(false))
	after := time.Now()
	defer release(t, lease)
	exp := lease.Expiry()
	if sl, session := lease.(driver.SessionLease); session {
		// guard finds a lock's session by the value Session returns.
		if sl.Session() != sl.Session() {
			t.Error("Session returned different values for one lease")
		}
		// A session's expiry follows the session's own TTL.
		if !exp.After(after) {
			t.Errorf("Expiry %v of a fresh session lease is not in the future (now %v)", exp, after)
		}
		return
	}
	if exp.After(after.Add(ttl)) {
		t.Errorf("Expiry is %v after the acquisition returned, later than its TTL %v", exp.Sub(after), ttl)
	}
	if exp.Before(before.Add(ttl / 2)) {
		t.Errorf("Expiry is %v after the acquisition began, less than half its TTL %v", exp.Sub(before), ttl)
	}
	time.Sleep(ttl / 10)
	before = time.Now()
	if err := lease.Refresh(ctx, ttl); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	after = time.Now()
	exp2 := lease.Expiry()
	if exp2.After(after.Add(ttl)) || exp2.Before(before.Add(ttl/2)) {
		t.Errorf("after Refresh, Expiry is %v past the refresh's start (TTL %v, refresh took %v)", exp2.Sub(before), ttl, after.Sub(before))
	}
	if !exp2.After(exp) {
		t.Errorf("Refresh did not move Expiry forward: %v then %v", exp, exp2)
	}
}

// testWaitWakes holds the lock with a TTL far longer than the waiter's
// patience, so only a release can let the waiter in.
func testWaitWakes(t *testing.T, b *Backend) {
	long := driver.AcquireOptions{TTL: 10 * b.patience()}
	ctx := b.ctx(t)
	l1, l2 := b.NewLocker(t), b.NewLocker(t)
	k := key(t)
	lease := mustAcquire(t, l1, ctx, k, long)
	waiting := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		close(waiting)
		wctx, cancel := context.WithTimeout(ctx, b.patience()/2)
		defer cancel()
		l, err := l2.Acquire(wctx, k, driver.AcquireOptions{TTL: b.ttl(), Wait: true})
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	<-waiting
	time.Sleep(50 * time.Millisecond) // let the waiter start waiting; either order is correct
	release(t, lease)
	if err := <-got; err != nil {
		t.Fatalf("waiter was not woken by the release: %v", err)
	}
}

func testCancelWhileWaiting(t *testing.T, b *Backend) {
	ctx := b.ctx(t)
	l1, l2, l3 := b.NewLocker(t), b.NewLocker(t), b.NewLocker(t)
	k := key(t)
	lease := mustAcquire(t, l1, ctx, k, b.opts(false))
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		l, err := l2.Acquire(wctx, k, driver.AcquireOptions{TTL: b.ttl(), Wait: true, Fair: b.FIFO})
		if err == nil {
			l.Release(context.Background())
		}
		got <- err
	}()
	if b.Waiters != nil {
		b.eventually(t, "the waiter is queued", func() bool { return b.Waiters(t, k) >= 1 })
	} else {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: got %v, want context.Canceled", err)
	}
	release(t, lease)
	// The cancelled waiter must have left nothing that blocks the next
	// client: no queue entry, no key. The next client may wait a moment,
	// well within the TTL: an attempt the waiter had sent just before the
	// cancel may still reach the server, after the release, and take the
	// lock (the client cannot recall it), and a backend can only give
	// such a grant back once it has happened.
	nctx, ncancel := context.WithTimeout(ctx, b.ttl()/2)
	defer ncancel()
	release(t, mustAcquire(t, l3, nctx, k, driver.AcquireOptions{TTL: b.ttl(), Wait: true, Fair: b.FIFO}))
	if b.Waiters != nil {
		b.eventually(t, "nothing is left queued", func() bool { return b.Waiters(t, k) == 0 })
	}
}

func testFIFO(t *testing.T, b *Backend) {
	if !b.FIFO {
		t.Skip("backend does not claim FIFO order")
	}
	if b.Waiters == nil {
		t.Fatal("Backend.FIFO needs Backend.Waiters")
	}
	const waiters = 5
	ctx := b.ctx(t)
	k := key(t)
	fair := driver.AcquireOptions{TTL: b.ttl(), Wait: true, Fair: true}
	first := mustAcquire(t, b.NewLocker(t), ctx, k, driver.AcquireOptions{TTL: 10 * b.patience(), Fair: true})
	base := b.Waiters(t, k)
	order := make(chan int, waiters)
	failed := make(chan error, waiters)
	released := make(chan error, waiters)
	for i := range waiters {
		l := b.NewLocker(t)
		go func() {
			lease, err := l.Acquire(ctx, k, fair)
			if err != nil {
				failed <- err
				return
			}
			order <- i
			time.Sleep(5 * time.Millisecond)
			released <- lease.Release(context.Background())
		}()
		b.eventually(t, fmt.Sprintf("waiter %d is queued", i), func() bool { return b.Waiters(t, k) >= base+i+1 })
	}
	release(t, first)
	for i := range waiters {
		select {
		case got := <-order:
			if got != i {
				t.Errorf("handoff %d went to waiter %d, want %d (FIFO)", i, got, i)
			}
		case err := <-failed:
			t.Fatalf("waiter failed: %v", err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for handoffs")
		}
	}
	for range waiters {
		if err := <-released; err != nil {
			t.Error(err)
		}
	}
}

func testReadWrite(t *testing.T, b *Backend) {
	probe, ok := b.NewLocker(t).(driver.RWLocker)
	if !ok {
		t.Skip("backend does not implement driver.RWLocker")
	}
	ctx := b.ctx(t)
	rw := func() driver.RWLocker { return b.NewLocker(t).(driver.RWLocker) }
	k := key(t)
	try := b.opts(false)

	// Many readers at once; no writer while any reads.
	r1, err := probe.AcquireRead(ctx, k, try)
	if err != nil {
		t.Fatalf("AcquireRead: %v", err)
	}
	r2, err := rw().AcquireRead(ctx, k, try)
	if err != nil {
		t.Fatalf("second AcquireRead while only readers hold: %v", err)
	}
	if w, err := rw().AcquireWrite(ctx, k, try); !errors.Is(err, driver.ErrNotAcquired) {
		if err == nil {
			w.Release(ctx)
		}
		t.Fatalf("AcquireWrite while readers hold: got %v, want ErrNotAcquired", err)
	}
	if r1.Token() == r2.Token() {
		t.Errorf("two read leases share token %d", r1.Token())
	}
	release(t, r1)
	release(t, r2)

	// One writer; no reader or other writer while it writes.
	w, err := rw().AcquireWrite(ctx, k, try)
	if err != nil {
		t.Fatalf("AcquireWrite on a free lock: %v", err)
	}
	if r, err := rw().AcquireRead(ctx, k, try); !errors.Is(err, driver.ErrNotAcquired) {
		if err == nil {
			r.Release(ctx)
		}
		t.Fatalf("AcquireRead while a writer holds: got %v, want ErrNotAcquired", err)
	}
	if w2, err := rw().AcquireWrite(ctx, k, try); !errors.Is(err, driver.ErrNotAcquired) {
		if err == nil {
			w2.Release(ctx)
		}
		t.Fatalf("second AcquireWrite: got %v, want ErrNotAcquired", err)
	}
	release(t, w)

	// A waiting writer is not starved: once it is queued behind a reader,
	// new readers wait too.
	if b.Waiters == nil {
		t.Log("writer preference not checked: Backend.Waiters is nil")
		return
	}
	reader, err := rw().AcquireRead(ctx, k, b.opts(false))
	if err != nil {
		t.Fatalf("AcquireRead: %v", err)
	}
	base := b.Waiters(t, k)
	wrote := make(chan error, 1)
	go func() {
		w, err := rw().AcquireWrite(ctx, k, b.opts(true))
		if err == nil {
			err = w.Release(context.Background())
		}
		wrote <- err
	}()
	b.eventually(t, "the writer is queued", func() bool { return b.Waiters(t, k) > base })
	if r, err := rw().AcquireRead(ctx, k, try); !errors.Is(err, driver.ErrNotAcquired) {
		if err == nil {
			r.Release(ctx)
		}
		t.Fatalf("new reader while a writer waits: got %v, want ErrNotAcquired (writers must not starve)", err)
	}
	release(t, reader)
	if err := <-wrote; err != nil {
		t.Fatalf("waiting writer: %v", err)
	}
}

func testSemaphore(t *testing.T, b *Backend) {
	probe, ok := b.NewLocker(t).(driver.Semaphorer)
	if !ok {
		t.Skip("backend does not implement driver.Semaphorer")
	}
	const permits = 3
	ctx := b.ctx(t)
	k := key(t)
	sem := func() driver.Semaphorer { return b.NewLocker(t).(driver.Semaphorer) }

	t0 := time.Now() // no permit taken below may expire before t0+TTL
	var held []driver.Lease
	for i := range permits {
		l, err := sem().AcquireSemaphore(ctx, k, permits, b.opts(false))
		if err != nil {
			t.Fatalf("permit %d of %d: %v", i+1, permits, err)
		}
		held = append(held, l)
	}
	if l, err := probe.AcquireSemaphore(ctx, k, permits, b.opts(false)); !errors.Is(err, driver.ErrNotAcquired) {
		if err == nil {
			l.Release(ctx)
		}
		t.Fatalf("permit %d of %d: got %v, want ErrNotAcquired", permits+1, permits, err)
	}
	// A released permit can be taken again, by a waiter.
	waited := make(chan error, 1)
	go func() {
		l, err := probe.AcquireSemaphore(ctx, k, permits, b.opts(true))
		if err == nil {
			err = l.Release(context.Background())
		}
		waited <- err
	}()
	release(t, held[0])
	if err := <-waited; err != nil {
		t.Fatalf("waiting for a released permit: %v", err)
	}
	// The permit of a holder that vanished comes back after its TTL (only
	// checkable where abandoning the lease is enough to make it expire).
	if b.Abandon == nil {
		l, err := probe.AcquireSemaphore(ctx, k, permits, b.opts(false))
		if err != nil {
			t.Fatalf("free permit: %v", err)
		}
		held[0] = l // now held[0..2] are abandoned holders: no refresh, no release
		l, err = sem().AcquireSemaphore(ctx, k, permits, b.opts(true))
		if err != nil {
			t.Fatalf("waiting for an expired permit: %v", err)
		}
		if since := time.Since(t0); since < b.ttl()/2 {
			t.Errorf("a permit came back after %v, before half its TTL %v", since, b.ttl())
		}
		release(t, l)
	} else {
		for _, l := range held[1:] {
			release(t, l)
		}
	}

	// Under contention, never more than permits holders.
	var inside, peak atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	k2 := key(t)
	for range 8 {
		s := sem()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				l, err := s.AcquireSemaphore(ctx, k2, permits, b.opts(true))
				if err != nil {
					errs <- err
					return
				}
				n := inside.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := l.Release(context.Background()); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if p := peak.Load(); p > permits {
		t.Errorf("%d holders of a %d-permit semaphore at once", p, permits)
	}
}

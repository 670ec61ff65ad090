package zklock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// holderEnv carries "servers|key" to the holder process of TestKilledHolder.
const holderEnv = "WARDEN_ZK_TEST_HOLDER"

// TestHelperHolder is not a test: it is the holder process that
// TestKilledHolderFreesLock starts from the test binary and kills.
func TestHelperHolder(t *testing.T) {
	spec, ok := os.LookupEnv(holderEnv)
	if !ok {
		t.Skip("helper process of TestKilledHolderFreesLock")
	}
	addrs, key, _ := strings.Cut(spec, "|")
	l, err := New(strings.Split(addrs, ","), WithSessionTimeout(testSession), WithRoot(testRoot), WithLogger(discard{}))
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	lease, err := l.Acquire(context.Background(), key, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Printf("HELD %d\n", lease.Token())
	time.Sleep(2 * time.Minute) // until killed; bounded in case the parent died
	os.Exit(1)
}

// TestKilledHolderFreesLock kills -9 a process that holds a lock: the next
// waiter must get it once the server expires the dead session, within the
// session timeout plus a second.
func TestKilledHolderFreesLock(t *testing.T) {
	srv := servers(t)
	key := testKey(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), holderEnv+"="+strings.Join(srv, ",")+"|"+key)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "HELD ") || strings.HasPrefix(sc.Text(), "ERR ") {
				line <- sc.Text()
				return
			}
		}
		line <- "holder exited: " + fmt.Sprint(sc.Err())
	}()
	var held uint64
	select {
	case l := <-line:
		tok, ok := strings.CutPrefix(l, "HELD ")
		if !ok {
			t.Fatalf("holder process: %s", l)
		}
		held, _ = strconv.ParseUint(tok, 10, 64)
	case <-time.After(60 * time.Second):
		t.Fatal("holder process did not report holding the lock within 60s")
	}

	waiter, probe := dial(t, srv), dial(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := waiter.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("try while the holder process holds: got %v, want ErrNotAcquired", err)
	}
	type result struct {
		lease driver.Lease
		err   error
		at    time.Time
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession, Wait: true})
		got <- result{l, err, time.Now()}
	}()
	eventually(t, "the waiter is queued", func() bool { return waiters(t, probe, key) == 1 })

	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	defer r.lease.Release(context.Background())
	after := r.at.Sub(killed)
	t.Logf("lock of the killed holder granted to the waiter %v after the kill (session timeout %v)", after, testSession)
	if after > testSession+time.Second {
		t.Errorf("waiter acquired %v after the kill, more than the session timeout %v plus 1s", after, testSession)
	}
	if r.lease.Token() <= held {
		t.Errorf("waiter's token %d is not greater than the killed holder's %d", r.lease.Token(), held)
	}
}

// TestLostConnectionFiresDoneFirst cuts the holder off the server while
// another client waits: the holder's Done must fire before the other client
// is granted the lock, whether the connection drops (cut) or goes silent
// (blackhole).
func TestLostConnectionFiresDoneFirst(t *testing.T) {
	for _, mode := range []string{"cut", "blackhole"} {
		t.Run(mode, func(t *testing.T) {
			srv := servers(t)
			p := drivertest.StartProxy(t, srv[0])
			holder, other, probe := dial(t, []string{p.Addr()}), dial(t, srv), dial(t, srv)
			key := testKey(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			lease, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession})
			if err != nil {
				t.Fatal(err)
			}
			doneAt := make(chan time.Time, 1)
			go func() {
				<-sessionDone(lease)
				doneAt <- time.Now()
			}()
			type result struct {
				lease     driver.Lease
				err       error
				doneFirst bool
			}
			got := make(chan result, 1)
			go func() {
				l, err := other.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession, Wait: true})
				r := result{lease: l, err: err}
				select {
				case <-sessionDone(lease):
					r.doneFirst = true
				default:
				}
				got <- r
			}()
			eventually(t, "the other client is queued", func() bool { return waiters(t, probe, key) == 1 })

			cutAt := time.Now()
			if mode == "cut" {
				p.Cut()
			} else {
				p.Blackhole()
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("other client: %v", r.err)
			}
			defer r.lease.Release(context.Background())
			if !r.doneFirst {
				t.Fatal("the other client was granted the lock before the cut-off holder's Done fired")
			}
			t.Logf("holder's Done fired %v after the %s; the other client was granted the lock after %v",
				(<-doneAt).Sub(cutAt), mode, time.Since(cutAt))
			if err := lease.Refresh(ctx, testSession); !errors.Is(err, driver.ErrNotHeld) {
				t.Errorf("Refresh of the lost lease: got %v, want ErrNotHeld", err)
			}
			if r.lease.Token() <= lease.Token() {
				t.Errorf("new token %d not greater than the lost lease's %d", r.lease.Token(), lease.Token())
			}
		})
	}
}

// TestServerStopFiresDone kills the (test's own) server under a holder: with
// nobody to tell it, the holder must still give the lease up before the
// session timeout runs out.
func TestServerStopFiresDone(t *testing.T) {
	s := startServer(t)
	holder := dial(t, []string{s.addr})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Waiting: a JVM just started on a loaded machine may turn the first
	// connection away, which a non-waiting Acquire would report.
	lease, err := holder.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Refresh(ctx, testSession); err != nil {
		t.Fatalf("Refresh while connected: %v", err)
	}
	stopped := time.Now()
	s.Kill()
	select {
	case <-sessionDone(lease):
		t.Logf("Done fired %v after the server was killed (session timeout %v)", time.Since(stopped), testSession)
	case <-time.After(30 * time.Second):
		t.Fatal("Done did not fire with the server gone")
	}
	if since := time.Since(stopped); since >= testSession {
		t.Errorf("Done fired %v after the server died, not before the session timeout %v", since, testSession)
	}
	if err := lease.Refresh(ctx, testSession); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Refresh after Done: got %v, want ErrNotHeld", err)
	}
}

// TestCancelledWaitersLeaveNoNode cancels waiters, queued or still creating
// their node, and lists the lock's nodes afterwards: only the holder's stays.
func TestCancelledWaitersLeaveNoNode(t *testing.T) {
	srv := servers(t)
	holder, probe := dial(t, srv), dial(t, srv)
	key := testKey(t)
	ctx := context.Background()
	lease, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}

	const queued = 3
	wctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, queued)
	for range queued {
		w := dial(t, srv)
		go func() {
			l, err := w.Acquire(wctx, key, driver.AcquireOptions{TTL: testSession, Wait: true})
			if err == nil {
				l.Release(ctx)
			}
			errs <- err
		}()
	}
	eventually(t, "the waiters are queued", func() bool { return waiters(t, probe, key) == queued })
	cancel()
	for range queued {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter: got %v, want context.Canceled", err)
		}
	}
	// A waiter cancelled between its create completing and Acquire seeing
	// it leaves the delete to the background cleanup: wait for it, bounded.
	eventually(t, "only the holder's node is left", func() bool { return len(children(t, probe, key)) == 1 })

	// Deadlines that end at any point of an acquisition, the create included:
	// a node made after the caller gave up is cleaned up in the background.
	w := dial(t, srv)
	for i := range 20 {
		dctx, cancel := context.WithTimeout(ctx, time.Duration(i)*300*time.Microsecond)
		_, err := w.Acquire(dctx, key, driver.AcquireOptions{TTL: testSession, Wait: true})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("waiter with a deadline: got %v, want context.DeadlineExceeded", err)
		}
	}
	eventually(t, "only the holder's node is left", func() bool { return len(children(t, probe, key)) == 1 })
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A create the runner sent after its caller gave up may land after the
	// check above saw the holder's node alone; its cleanup follows it.
	eventually(t, "no node is left after the release", func() bool { return len(children(t, probe, key)) == 0 })
}

func TestKeysBecomeValidNodeNames(t *testing.T) {
	srv := servers(t)
	l := dial(t, srv)
	ctx := context.Background()
	seen := map[string]string{}
	for _, key := range []string{".", "..", "a/b", "a%2Fb", "zookeeper", "ключ/ü", "\ufff0\ue000", "a b:c-d_e.f", "x~semaphore"} {
		e := escape(key)
		if prev, dup := seen[e]; dup {
			t.Errorf("keys %q and %q both become %q", prev, key, e)
		}
		seen[e] = key
		lease, err := l.Acquire(ctx, key+"/"+testKey(t), driver.AcquireOptions{TTL: testSession})
		if err != nil {
			t.Errorf("Acquire(%q): %v", key, err)
			continue
		}
		if err := lease.Release(ctx); err != nil {
			t.Errorf("Release(%q): %v", key, err)
		}
	}
}

// TestNoPerLockRequests holds 10,000 locks through guard for two session
// timeouts: once the data watches set after the grants are in place, the
// session's heartbeats, one every sixth of the timeout whatever the number
// of locks, are all that is sent, and no goroutine is added per lock.
func TestNoPerLockRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 10,000 locks")
	}
	drivertest.Exclusive(t, drivertest.HeavyTests)
	const n = 10_000
	l := dial(t, servers(t))
	g, err := guard.New(l, guard.WithTTL(testSession))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := testKey(t)
	before := runtime.NumGoroutine()
	locks := make([]*guard.Lock, n)
	for i := range locks {
		if locks[i], err = g.TryLock(ctx, fmt.Sprintf("%s/%d", base, i)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the held locks' watches are set", func() bool { return l.watching.Load() == 0 })
	requests, beats := l.requests.Load(), l.heartbeats.Load()
	window := 2 * testSession
	time.Sleep(window) // a window to count in, not a condition to wait for
	if d := l.requests.Load() - requests; d != 0 {
		t.Errorf("%d lock requests while %d locks were held", d, n)
	}
	if d, most := l.heartbeats.Load()-beats, int64(window/(testSession/6))+2; d > most {
		t.Errorf("%d heartbeats in %v, want at most %d whatever the number of locks", d, window, most)
	}
	if grown := runtime.NumGoroutine() - before; grown > 50 {
		t.Errorf("%d goroutines more with %d locks held", grown, n)
	}
	for i, lk := range locks {
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
	}
}

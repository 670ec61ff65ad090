package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// holdBackOnce holds back, on p, the one acquisition script the client
// sends next while armed, and no other command: the proxy's delay is set
// while that command is under way.
type holdBackOnce struct {
	p     *drivertest.Proxy
	delay time.Duration
	armed atomic.Bool
}

func (h *holdBackOnce) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *holdBackOnce) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if !strings.HasPrefix(cmd.Name(), "eval") || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmd)
		}
		h.p.SlowRequests(h.delay)
		defer h.p.SlowRequests(0)
		return next(ctx, cmd)
	}
}

func (h *holdBackOnce) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// An attempt that got no answer and reaches the server after its cleanup
// ran (held up on the network, as a lost segment sent again is) takes the
// free lock for an owner nobody holds: the cleanup runs again after a
// while, and gives it back long before its TTL runs out.
func TestLateAttemptGivenBack(t *testing.T) {
	// Held back past the cleanup's first run again (250ms after its
	// first), and past its second (1.25s after).
	for _, late := range []time.Duration{100 * time.Millisecond, 700 * time.Millisecond} {
		t.Run(late.String(), func(t *testing.T) { lateAttemptGivenBack(t, late) })
	}
}

func lateAttemptGivenBack(t *testing.T, late time.Duration) {
	p := drivertest.StartProxy(t, drivertest.Addr(t, addrEnv, addrDefault))
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	h := &holdBackOnce{p: p, delay: late}
	c.AddHook(h)
	l := newLocker(t, c)
	other := newLocker(t, newClient(t))
	key := fmt.Sprintf("late-attempt-%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 30 * time.Second}
	ctx := context.Background()

	// Scripts loaded, connections made.
	lease, err := l.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	h.armed.Store(true)
	actx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_, err = l.Acquire(actx, key, opts)
	cancel()
	if err == nil {
		t.Fatalf("an attempt held back %v, bounded by 10ms, succeeded", late)
	}

	// The held-back attempt lands on the free lock late after it was
	// sent, after its cleanup, and takes it: its state names an owner.
	// Read, not tried, so that no attempt of the test's takes the lock
	// first.
	state := newClient(t)
	held := func() bool {
		v, err := state.Get(ctx, mutexNamesOf(key).lock).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			t.Fatal(err)
		}
		f := strings.SplitN(v, ":", 5)
		return len(f) == 5 && f[0] != "0" && f[4] != ""
	}
	deadline := time.Now().Add(5 * time.Second)
	for !held() {
		if time.Now().After(deadline) {
			t.Fatal("the held-back attempt did not take the lock within 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	seen := time.Now()
	deadline = seen.Add(10 * time.Second)
	for {
		lease, err := other.Acquire(ctx, key, opts)
		if err == nil {
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the lock a late attempt took for nobody was not given back within 10s (its TTL: 30s)")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the lock a late attempt took was given back %v after it was seen taken", time.Since(seen).Round(time.Millisecond))
}

// However many attempts a slow server leaves unanswered, at most
// maxCleanupsAgain of their cleanups run again at a time; the others run
// once.
func TestCleanupsAgainBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 3 * maxCleanupsAgain
		l, runs := unansweredCleanups(n)
		synctest.Wait()
		if got := runs.Load(); got != n {
			t.Errorf("first runs: %d, want %d", got, n)
		}
		if got := runningAgain(l); got != maxCleanupsAgain {
			t.Errorf("cleanups to run again: %d, want %d", got, maxCleanupsAgain)
		}
		time.Sleep(21 * cleanupAgain)
		synctest.Wait()
		if got, want := runs.Load(), int32(n+3*maxCleanupsAgain); got != want {
			t.Errorf("runs after the pauses: %d, want %d", got, want)
		}
		if got := runningAgain(l); got != 0 {
			t.Errorf("cleanups still to run again: %d, want 0", got)
		}
	})
}

// TestCleanupsAgainEndAtClose: Close ends the runs again of cleanups under
// way, each after one last run, with no time passing, and returns once
// those runs are made, instead of leaving their goroutines for seconds; a
// cleanup that starts after Close runs once.
func TestCleanupsAgainEndAtClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 3
		l, runs := unansweredCleanups(n)
		synctest.Wait()
		start := time.Now()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		// Close has waited for the last runs.
		if got := runs.Load(); got != 2*n {
			t.Errorf("runs when Close returned: %d, want %d (one first run and one last run each)", got, 2*n)
		}
		synctest.Wait()
		if got := runningAgain(l); got != 0 {
			t.Errorf("cleanups still to run again after Close: %d, want 0", got)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("the runs again ended %v after Close, want at once", d)
		}
		l.cleanUp(context.Background(), func(context.Context) error {
			runs.Add(1)
			return nil
		}, false)
		time.Sleep(21 * cleanupAgain)
		synctest.Wait()
		if got := runs.Load(); got != 2*n+1 {
			t.Errorf("runs after a cleanup started after Close: %d, want %d (one run)", got, 2*n+1)
		}
	})
}

// unansweredCleanups starts, on a Locker of no client, the cleanups of n
// acquisitions whose latest attempt got no answer, each a function that
// counts its runs in runs.
func unansweredCleanups(n int) (l *Locker, runs *atomic.Int32) {
	l, runs = &Locker{notify: newNotifier(nil, func() {})}, new(atomic.Int32)
	f := func(context.Context) error {
		runs.Add(1)
		return nil
	}
	for range n {
		l.cleanUp(context.Background(), f, false)
	}
	return l, runs
}

// TestCloseWaitsForFirstRuns: Close waits, within its bound, for a
// cleanup making its first run (the one that gives back what an
// unanswered attempt took as soon as it can), so that the run is made
// while the caller's client is still open.
func TestCloseWaitsForFirstRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &Locker{notify: newNotifier(nil, func() {})}
		var ran atomic.Bool
		l.cleanUp(context.Background(), func(context.Context) error {
			time.Sleep(500 * time.Millisecond)
			ran.Store(true)
			return nil
		}, false)
		start := time.Now()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if !ran.Load() || time.Since(start) != 500*time.Millisecond {
			t.Errorf("Close returned after %v, the first run done: %v; want after the run, 500ms", time.Since(start), ran.Load())
		}

		// One that does not end within the bound holds Close for the
		// bound only.
		l = &Locker{notify: newNotifier(nil, func() {})}
		l.cleanUp(context.Background(), func(context.Context) error {
			time.Sleep(time.Minute)
			return nil
		}, false)
		start = time.Now()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != cleanupTimeout {
			t.Errorf("Close with a run that hangs returned after %v, want %v", d, cleanupTimeout)
		}
		time.Sleep(time.Minute) // the hung run's end
		synctest.Wait()
	})
}

// runningAgain is how many of l's cleanups are running again.
func runningAgain(l *Locker) int {
	l.cleanups.mu.Lock()
	defer l.cleanups.mu.Unlock()
	return l.cleanups.again
}

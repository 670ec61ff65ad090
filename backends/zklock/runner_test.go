package zklock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/internal/runner"
	"github.com/warden-go/warden/guard/driver"
)

// blocked is a request that returns when release is closed, and counts
// the runs abandoned by their caller.
type blocked struct {
	release chan struct{}
	ran     atomic.Bool
	left    atomic.Int32
}

func (b *blocked) Run() {
	<-b.release
	b.ran.Store(true)
}

func (b *blocked) Abandoned() { b.left.Add(1) }

// connectedLocker is a Locker with no session, only what send needs: a
// connection reported up, and the request timeout.
func connectedLocker(timeout time.Duration) *Locker {
	l := &Locker{requestTimeout: timeout, quit: make(chan struct{})}
	l.hosts = newHosts(l.quit, time.Minute)
	l.hosts.Connected()
	return l
}

// TestSendBounds: a request that does not answer leaves its caller at its
// ctx's end or at the request timeout, goes on without it and is abandoned
// once it returns, and its runner serves the next caller with a timer of
// its own (a request answered after most of the timeout is not cut short by
// the earlier one's). The runners end when the pool closes, or synctest
// would find them blocked.
func TestSendBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = time.Second
		l := connectedLocker(timeout)

		// Answered: the caller has the result, and the runner is kept.
		quick := &blocked{release: make(chan struct{})}
		close(quick.release)
		if err := l.send(t.Context(), "quick", quick); err != nil || !quick.ran.Load() {
			t.Fatalf("answered request: err %v, ran %v", err, quick.ran.Load())
		}
		if n := l.runners.Idle(); n != 1 {
			t.Fatalf("%d idle runners after one request, want 1", n)
		}

		// ctx ends first.
		hung := &blocked{release: make(chan struct{})}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := l.send(ctx, "hung", hung); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("request past its ctx: got %v, want context.DeadlineExceeded", err)
		}
		if took := time.Since(start); took != 300*time.Millisecond {
			t.Errorf("request past its ctx returned after %v, want 300ms", took)
		}
		close(hung.release)
		synctest.Wait()
		if n := hung.left.Load(); n != 1 {
			t.Errorf("request past its ctx abandoned %d times, want 1", n)
		}

		// The request timeout passes first.
		slow := &blocked{release: make(chan struct{})}
		start = time.Now()
		if err := l.send(t.Context(), "slow", slow); !errors.Is(err, driver.ErrUnavailable) {
			t.Fatalf("request past the timeout: got %v, want driver.ErrUnavailable", err)
		}
		if took := time.Since(start); took != timeout {
			t.Errorf("request past the timeout returned after %v, want %v", took, timeout)
		}
		close(slow.release)
		synctest.Wait()
		if n := slow.left.Load(); n != 1 {
			t.Errorf("request past the timeout abandoned %d times, want 1", n)
		}
		if n := l.runners.Idle(); n != 1 {
			t.Fatalf("%d idle runners after three requests in turn, want 1", n)
		}

		// The same runner again, answering just within the timeout.
		late := &blocked{release: make(chan struct{})}
		go func() {
			time.Sleep(timeout - time.Millisecond)
			close(late.release)
		}()
		if err := l.send(t.Context(), "late", late); err != nil || !late.ran.Load() {
			t.Fatalf("request answered within the timeout: err %v, ran %v", err, late.ran.Load())
		}
		if n := late.left.Load(); n != 0 {
			t.Errorf("answered request abandoned %d times", n)
		}

		l.runners.Close()
	})
}

// TestRunnersKept: after a burst of concurrent requests, at most
// runner.MaxIdle runners stay, and the others end.
func TestRunnersKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := connectedLocker(time.Second)
		const burst = 3 * runner.MaxIdle
		release := make(chan struct{})
		errs := make(chan error, burst)
		for range burst {
			go func() { errs <- l.send(t.Context(), "burst", &blocked{release: release}) }()
		}
		synctest.Wait()
		close(release)
		for range burst {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if n := l.runners.Idle(); n != runner.MaxIdle {
			t.Errorf("%d idle runners after a burst of %d, want %d", n, burst, runner.MaxIdle)
		}
		l.runners.Close()
	})
}

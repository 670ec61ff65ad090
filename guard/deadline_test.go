package guard_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// deadlineBound is the memory backend behind a client that honours its
// context's deadline but not its cancellation, as go-redis does with
// ContextTimeoutEnabled: while hung, a call returns at its ctx's deadline
// and not before, whatever else ends ctx. It declares
// driver.DeadlineBounded, and records for each kind of call whether it ran
// on a goroutine of guard's hand-off or on its caller's.
type deadlineBound struct {
	mem    *memory.Locker
	hung   atomic.Bool
	unhang chan struct{}
	// slow, when not 0, is how long every call takes to be answered
	// (nanoseconds); one whose ctx's deadline comes first ends then.
	slow atomic.Int64
	// down: every call fails at once, as on a refused connection.
	down atomic.Bool

	mu       sync.Mutex
	handedOn map[string]bool // by call: made on a hand-off goroutine
	acquires []acquireCall   // every acquisition, in order
}

// acquireCall is an acquisition a deadlineBound was asked for.
type acquireCall struct {
	wait, handed bool
}

func newDeadlineBound() *deadlineBound {
	return &deadlineBound{mem: memory.New(), unhang: make(chan struct{}), handedOn: map[string]bool{}}
}

func (d *deadlineBound) BoundedByDeadline() bool { return true }

// enter records where call runs, and holds it while d is hung.
func (d *deadlineBound) enter(ctx context.Context, call string, wait bool) error {
	buf := make([]byte, 16<<10)
	stack := string(buf[:runtime.Stack(buf, false)])
	handed := strings.Contains(stack, "internal/handoff")
	d.mu.Lock()
	d.handedOn[call] = handed
	if call == "acquire" {
		d.acquires = append(d.acquires, acquireCall{wait: wait, handed: handed})
	}
	d.mu.Unlock()
	var unhang <-chan struct{}
	var answered <-chan time.Time
	switch slow := d.slow.Load(); {
	case d.down.Load():
		return driver.Unavailable(ctx, syscall.ECONNREFUSED)
	case d.hung.Load():
		unhang = d.unhang
	case slow != 0:
		answered = time.After(time.Duration(slow))
	default:
		return nil
	}
	var atDeadline <-chan time.Time
	if end, ok := ctx.Deadline(); ok {
		atDeadline = time.After(time.Until(end))
	}
	select {
	case <-atDeadline:
		// A read past the connection's deadline, as the backend reports
		// it.
		return driver.Unavailable(ctx, os.ErrDeadlineExceeded)
	case <-unhang:
		return nil
	case <-answered:
		return nil
	}
}

// takeAcquires returns the acquisitions made since it was last called.
func (d *deadlineBound) takeAcquires() []acquireCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.acquires
	d.acquires = nil
	return a
}

// handedOff reports whether the latest call of that kind ran on a hand-off
// goroutine, and whether there was one.
func (d *deadlineBound) handedOff(call string) (handed, made bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	handed, made = d.handedOn[call]
	return handed, made
}

func (d *deadlineBound) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	return d.acquire(ctx, key, o, d.mem.Acquire)
}

func (d *deadlineBound) AcquireRead(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	return d.acquire(ctx, key, o, d.mem.AcquireRead)
}

func (d *deadlineBound) AcquireWrite(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	return d.acquire(ctx, key, o, d.mem.AcquireWrite)
}

// acquire makes an acquisition of the memory backend's (by f), as the
// hung client would.
func (d *deadlineBound) acquire(ctx context.Context, key string, o driver.AcquireOptions, f func(context.Context, string, driver.AcquireOptions) (driver.Lease, error)) (driver.Lease, error) {
	if err := d.enter(ctx, "acquire", o.Wait); err != nil {
		return nil, err
	}
	l, err := f(ctx, key, o)
	if err != nil {
		return nil, err
	}
	return &deadlineBoundLease{Lease: l, d: d}, nil
}

func (d *deadlineBound) Ping(ctx context.Context) error { return d.enter(ctx, "ping", false) }

type deadlineBoundLease struct {
	driver.Lease
	d *deadlineBound
}

func (l *deadlineBoundLease) Release(ctx context.Context) error {
	if err := l.d.enter(ctx, "release", false); err != nil {
		return err
	}
	return l.Lease.Release(ctx)
}

// A backend bounded by its context's deadline is called on the caller's
// goroutine where only a deadline can end the call (a release; an
// acquisition under a context with no cancellation), and still within the
// bound when it hangs; an acquisition whose context can be cancelled is
// handed off, so that a cancellation ends it at once, which such a
// backend would not.
func TestDeadlineBoundedBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDeadlineBound()
		g := newBubbleGuard(t, d, guard.WithCallTimeout(2*time.Second), guard.WithReleaseTimeout(time.Second))
		bg := context.Background()
		where := func(call string, wantHanded bool) {
			t.Helper()
			handed, made := d.handedOff(call)
			switch {
			case !made:
				t.Errorf("no %s reached the backend", call)
			case handed != wantHanded:
				t.Errorf("%s made on a hand-off goroutine: %v, want %v", call, handed, wantHanded)
			}
		}

		l, err := g.Lock(bg, "k", guard.NoWait())
		if err != nil {
			t.Fatal(err)
		}
		where("acquire", false)
		d.hung.Store(true)
		err = within(t, "Unlock, hung", time.Second, func() error { return l.Unlock(bg) })
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Unlock, hung: %v, want ErrUnavailable", err)
		}
		where("release", false)

		err = within(t, "Lock NoWait, hung", 2*time.Second, func() error {
			_, err := g.Lock(bg, "other", guard.NoWait())
			return err
		})
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Lock NoWait, hung: %v, want ErrUnavailable", err)
		}
		where("acquire", false)

		err = within(t, "Lock WaitAtMost(1s), hung", time.Second, func() error {
			_, err := g.Lock(bg, "fourth", guard.WaitAtMost(time.Second))
			return err
		})
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Lock WaitAtMost(1s), hung: %v, want ErrUnavailable", err)
		}
		where("acquire", false)

		err = within(t, "Ping, hung", 2*time.Second, func() error { return g.Ping(bg) })
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Ping, hung: %v, want ErrUnavailable", err)
		}
		where("ping", false)

		ctx, cancel := context.WithCancel(bg)
		time.AfterFunc(100*time.Millisecond, cancel)
		err = within(t, "Lock cancelled after 100ms, hung", 100*time.Millisecond, func() error {
			_, err := g.Lock(ctx, "third", guard.NoWait())
			return err
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Lock cancelled, hung: %v, want context.Canceled", err)
		}
		where("acquire", true)

		close(d.unhang)
		synctest.Wait()
	})
}

// A waiting acquisition whose context can be cancelled, on a backend
// bounded by its context's deadline, starts with one attempt that does not
// wait, made on the caller's goroutine: the acquisition ends there when
// the lock is free. When the lock is held, or the backend does not answer
// within the attempt's short bound, the acquisition goes on on a hand-off
// goroutine, and the Guard makes no such attempt for a while. A
// cancellation during that attempt is honoured within guard's grace.
func TestDeadlineBoundedFastAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDeadlineBound()
		g := newBubbleGuard(t, d)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		calls := func(what string, want ...acquireCall) {
			t.Helper()
			if got := d.takeAcquires(); !slices.Equal(got, want) {
				t.Errorf("%s: acquisitions %+v, want %+v", what, got, want)
			}
		}
		fast := acquireCall{wait: false, handed: false}
		handedWait := acquireCall{wait: true, handed: true}

		l, err := g.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		calls("free lock", fast)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err = g.Lock(ctx, "k", guard.WaitAtMost(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		calls("free lock, bounded wait", fast)

		// Held: the fast attempt finds it so, and the acquisition waits on
		// a hand-off goroutine until the holder lets go.
		got := make(chan error, 1)
		go func() {
			l2, err := g.Lock(ctx, "k")
			if err == nil {
				err = l2.Unlock(ctx)
			}
			got <- err
		}()
		synctest.Wait()
		calls("held lock", fast, handedWait)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("waiter: %v", err)
		}
		d.takeAcquires()

		// Paused after finding it held: handed off at once.
		l, err = g.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		calls("free lock within a second of the refusal", handedWait)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		l, err = g.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		calls("free lock a second after the refusal", fast)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}

		// Neither a single attempt, nor a context that cannot be
		// cancelled, nor a lock other than a plain one takes the fast
		// path.
		l, err = g.Lock(ctx, "k", guard.Write())
		if err != nil {
			t.Fatal(err)
		}
		calls("Write", handedWait)
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err = g.Lock(ctx, "k", guard.NoWait())
		if err != nil {
			t.Fatal(err)
		}
		calls("NoWait", acquireCall{wait: false, handed: true})
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err = g.Lock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		calls("context.Background", acquireCall{wait: true, handed: false})
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Nor a wait bound shorter than the fast attempt's, which would
		// outlast it.
		l, err = g.Lock(ctx, "k", guard.WaitAtMost(5*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if a := d.takeAcquires(); len(a) == 0 || !a[0].handed {
			t.Errorf("WaitAtMost(5ms): acquisitions %+v, want them handed off", a)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}

		// Hung: a cancellation during the fast attempt ends the
		// acquisition within the grace.
		d.hung.Store(true)
		cctx, ccancel := context.WithCancel(context.Background())
		time.AfterFunc(2*time.Millisecond, ccancel)
		err = within(t, "Lock cancelled during the fast attempt, hung", 2*time.Millisecond, func() error {
			_, err := g.Lock(cctx, "hung")
			return err
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Lock cancelled, hung: %v, want context.Canceled", err)
		}
		calls("hung, cancelled", fast)

		// Hung, not cancelled: past the fast attempt's bound the
		// acquisition goes on handed off, and ends at its wait bound,
		// counted from its start (fake time: exact); and the Guard makes
		// no fast attempt for a while after one that got no answer.
		time.Sleep(time.Second)
		start := time.Now()
		_, err = g.Lock(ctx, "hung", guard.WaitAtMost(time.Second))
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Lock WaitAtMost(1s), hung: %v, want ErrUnavailable", err)
		}
		if took := time.Since(start); took != time.Second {
			t.Errorf("Lock WaitAtMost(1s), hung: took %v, want its wait bound, 1s", took)
		}
		if a := d.takeAcquires(); len(a) < 2 || a[0] != fast || !a[1].handed {
			t.Errorf("hung: acquisitions %+v, want the fast attempt, then handed off", a)
		}
		if _, err := g.Lock(ctx, "hung", guard.WaitAtMost(100*time.Millisecond)); !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("Lock WaitAtMost(100ms), hung, again: %v, want ErrUnavailable", err)
		}
		if a := d.takeAcquires(); len(a) == 0 || !a[0].handed {
			t.Errorf("hung, right after an attempt that got no answer: acquisitions %+v, want them handed off", a)
		}
		close(d.unhang)
		synctest.Wait()
	})
}

// TestFastAttemptsOnASlowBackend: on a backend that answers, but slower
// than the fast attempt's bound (a distant server), each fast attempt in a
// row that gets no answer doubles the pause before the next one, so that
// a Guard taking a lock every second makes one at its 1st, 2nd, 4th, 8th,
// 16th... acquisition, not at every other one; and one answered in time
// ends the doubling.
func TestFastAttemptsOnASlowBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDeadlineBound()
		g := newBubbleGuard(t, d)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// fast takes and lets go of the lock, and reports whether the
		// acquisition started with a fast attempt.
		fast := func() bool {
			t.Helper()
			l, err := g.Lock(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			a := d.takeAcquires()
			return len(a) > 0 && !a[0].handed
		}
		d.slow.Store(int64(15 * time.Millisecond))
		// Each acquisition starts a second after the previous one started.
		var fastAt []int
		for i := range 40 {
			start := time.Now()
			if fast() {
				fastAt = append(fastAt, i)
			}
			time.Sleep(time.Second - time.Since(start))
		}
		// A fast attempt at 0 misses, pausing 1s (from its end, which is
		// past the start of acquisition 1): the next at 2, pausing 2s,
		// then 5 (4s), 10 (8s), 19 (16s), 36.
		if want := []int{0, 2, 5, 10, 19, 36}; !slices.Equal(fastAt, want) {
			t.Errorf("slow backend: fast attempts at acquisitions %v, want %v", fastAt, want)
		}

		// Answering in time again: the next fast attempt, after the
		// longest pause (about 8.5 minutes), is granted and the doubling
		// ends: slow again, the pause after a miss is back to 1s.
		d.slow.Store(0)
		time.Sleep(10 * time.Minute)
		for i := range 3 {
			if !fast() {
				t.Errorf("fast backend again, acquisition %d: handed off, want a fast attempt", i)
			}
		}
		d.slow.Store(int64(15 * time.Millisecond))
		if got := []bool{fast(), fast()}; !slices.Equal(got, []bool{true, false}) {
			t.Errorf("slow again, two acquisitions in a row: fast attempts %v, want [true false]", got)
		}
		time.Sleep(1100 * time.Millisecond)
		if !fast() {
			t.Errorf("slow again, 1.1s after the first miss since: handed off, want a fast attempt")
		}
	})
}

// TestFastAttemptPauseCounts: the attempts that miss together, in one
// window, count as one miss; a refusal (an answer in time) ends the
// doubling as a grant does; and an attempt that fails at once (a refused
// connection) pauses for a second without doubling.
func TestFastAttemptPauseCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDeadlineBound()
		g := newBubbleGuard(t, d)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// lock takes and lets go of key, waiting at most 50ms, and reports
		// whether the acquisition started with a fast attempt.
		lock := func(key string) bool {
			t.Helper()
			l, err := g.Lock(ctx, key, guard.WaitAtMost(50*time.Millisecond))
			if err == nil {
				err = l.Unlock(ctx)
			}
			if err != nil && !errors.Is(err, guard.ErrNotAcquired) && !errors.Is(err, guard.ErrUnavailable) {
				t.Fatal(err)
			}
			a := d.takeAcquires()
			return len(a) > 0 && !a[0].handed
		}

		// Ten acquisitions at once on a slow backend: one miss, a pause
		// of a second.
		d.slow.Store(int64(15 * time.Millisecond))
		var wg sync.WaitGroup
		for i := range 10 {
			wg.Go(func() { lock(fmt.Sprint("k", i)) })
		}
		wg.Wait()
		d.slow.Store(0)
		time.Sleep(1100 * time.Millisecond)
		if !lock("k") {
			t.Errorf("1.1s after ten misses at once: handed off, want a fast attempt (one miss, a 1s pause)")
		}

		// Two misses in a row (pauses 1s, then 2s), then a refusal: the
		// next miss pauses for a second again.
		d.slow.Store(int64(15 * time.Millisecond))
		lock("k")
		time.Sleep(1100 * time.Millisecond)
		lock("k")
		time.Sleep(2100 * time.Millisecond)
		d.slow.Store(0)
		held, err := g.Lock(context.Background(), "held")
		if err != nil {
			t.Fatal(err)
		}
		if !lock("held") {
			t.Errorf("after the pause: handed off, want a fast attempt, refused")
		}
		if err := held.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		d.slow.Store(int64(15 * time.Millisecond))
		time.Sleep(1100 * time.Millisecond)
		lock("k")
		time.Sleep(1100 * time.Millisecond)
		if !lock("k") {
			t.Errorf("1.1s after a miss that followed a refusal: handed off, want a fast attempt (the doubling ended)")
		}

		// A backend that refuses connections: a fast attempt every second,
		// the pause not doubled.
		time.Sleep(2100 * time.Millisecond)
		d.slow.Store(0)
		d.down.Store(true)
		for i := range 4 {
			if !lock("k") {
				t.Errorf("refused connections, acquisition %d, 1.1s after the last: handed off, want a fast attempt", i)
			}
			time.Sleep(1100 * time.Millisecond)
		}
	})
}

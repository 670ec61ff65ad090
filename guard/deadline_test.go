package guard_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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

	mu       sync.Mutex
	handedOn map[string]bool // by call: made on a hand-off goroutine
}

func newDeadlineBound() *deadlineBound {
	return &deadlineBound{mem: memory.New(), unhang: make(chan struct{}), handedOn: map[string]bool{}}
}

func (d *deadlineBound) BoundedByDeadline() bool { return true }

// enter records where call runs, and holds it while d is hung.
func (d *deadlineBound) enter(ctx context.Context, call string) error {
	buf := make([]byte, 16<<10)
	stack := string(buf[:runtime.Stack(buf, false)])
	d.mu.Lock()
	d.handedOn[call] = strings.Contains(stack, "internal/handoff")
	d.mu.Unlock()
	if !d.hung.Load() {
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
	case <-d.unhang:
		return nil
	}
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
	if err := d.enter(ctx, "acquire"); err != nil {
		return nil, err
	}
	l, err := d.mem.Acquire(ctx, key, o)
	if err != nil {
		return nil, err
	}
	return &deadlineBoundLease{Lease: l, d: d}, nil
}

func (d *deadlineBound) Ping(ctx context.Context) error { return d.enter(ctx, "ping") }

type deadlineBoundLease struct {
	driver.Lease
	d *deadlineBound
}

func (l *deadlineBoundLease) Release(ctx context.Context) error {
	if err := l.d.enter(ctx, "release"); err != nil {
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

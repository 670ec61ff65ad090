package guard_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/internal/handoff"
)

// lateGuards returns a Guard on d with a 3s TTL, and another on the
// memory backend d stands before, which finds the locks d's gave back.
func lateGuards(t *testing.T, d *drivertest.LateGrants) (late, other *guard.Guard) {
	t.Helper()
	late, err := guard.New(d, guard.WithTTL(3*time.Second), guard.WithIdleCallers(0))
	if err != nil {
		t.Fatal(err)
	}
	other, err = guard.New(d.Locker, guard.WithTTL(3*time.Second), guard.WithIdleCallers(0))
	if err != nil {
		t.Fatal(err)
	}
	return late, other
}

// free fails t unless other takes key at once: nothing holds it.
func free(t *testing.T, other *guard.Guard, key, what string) {
	t.Helper()
	l, err := other.Lock(context.Background(), key, guard.NoWait())
	if err != nil {
		t.Errorf("%s: the lock was not given back: %v", what, err)
		return
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestGrantTooLateToHold: a lease granted only after it ran out, or so
// close to its end that the loss margin has begun, is not handed to the
// caller as held, where another can take the lock. A single attempt fails
// with ErrUnavailable, its work does not start, and the lease is given
// back. One answered with time to spare is held as usual.
func TestGrantTooLateToHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &drivertest.LateGrants{Locker: memory.New()}
		g, other := lateGuards(t, d)
		ctx := context.Background()
		// Past its end, and within the margin (a tenth of the TTL) of it.
		for _, late := range []time.Duration{4 * time.Second, 2800 * time.Millisecond} {
			d.Late = late
			ran := false
			err := g.Do(ctx, "k", func(context.Context, *guard.Lock) error {
				ran = true
				return nil
			}, guard.NoWait())
			if !errors.Is(err, guard.ErrUnavailable) || ran {
				t.Errorf("granted %v late: Do %v, fn ran %v; want ErrUnavailable and no run", late, err, ran)
			}
			synctest.Wait() // the lease given back
			if l, err := g.Lock(ctx, "k", guard.NoWait()); !errors.Is(err, guard.ErrUnavailable) || l != nil {
				t.Errorf("granted %v late: Lock %v, %v; want ErrUnavailable and no lock", late, l, err)
			}
			synctest.Wait()
			free(t, other, "k", "granted "+late.String()+" late")
		}
		d.Late = time.Second
		l, err := g.Lock(ctx, "k", guard.NoWait())
		if err != nil {
			t.Fatalf("granted 1s late of a 3s TTL: %v, want it held", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWaitAgainAfterALateGrant: a waiting acquisition whose lease is
// granted too late to be held gives it back and waits again, within its
// bound, for a lease it can hold; its work runs once, on that one. With no
// bound it waits as long as the grants come late.
func TestWaitAgainAfterALateGrant(t *testing.T) {
	for _, tc := range []struct {
		name  string
		late  int
		opts  []guard.LockOption
		after time.Duration // the time the acquisition takes
	}{
		{"bounded", 1, []guard.LockOption{guard.WaitAtMost(20 * time.Second)}, 4 * time.Second},
		{"unbounded", 3, nil, 12 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &drivertest.LateGrants{Locker: memory.New(), Late: 4 * time.Second, OnTimeAfter: tc.late}
				g, other := lateGuards(t, d)
				start := time.Now()
				runs := 0
				err := g.Do(context.Background(), "k", func(ctx context.Context, l *guard.Lock) error {
					runs++
					// Each wait after the second late grant is paced: a
					// pause of up to 1ms, then 2ms.
					if took := time.Since(start); took < tc.after || took > tc.after+3*time.Millisecond {
						t.Errorf("held after %v, want %v (%d late grants, 4s late each) and the pauses", took, tc.after, tc.late)
					}
					if _, err := other.Lock(ctx, "k", guard.NoWait()); !errors.Is(err, guard.ErrNotAcquired) {
						t.Errorf("another took the lock while it was held: %v", err)
					}
					return nil
				}, tc.opts...)
				if err != nil || runs != 1 {
					t.Errorf("Do: %v, %d runs; want nil and 1", err, runs)
				}
				if n := d.LateOnes(); n != tc.late {
					t.Errorf("%d late grants, want %d", n, tc.late)
				}
				synctest.Wait()
				free(t, other, "k", "after Do")
			})
		})
	}
}

// TestLateGrantsPastTheBound: a waiting acquisition whose every grant comes
// too late returns within its bound (and the grace of a call not answered)
// without its work starting, and leaves no lease held: each late one is
// given back. The third grant is still on its way when the bound runs out,
// and holds the lock then: the wait ends as one for a held lock does.
func TestLateGrantsPastTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &drivertest.LateGrants{Locker: memory.New(), Late: 4 * time.Second}
		g, other := lateGuards(t, d)
		start := time.Now()
		ran := false
		err := g.Do(context.Background(), "k", func(context.Context, *guard.Lock) error {
			ran = true
			return nil
		}, guard.WaitAtMost(10*time.Second))
		if took := time.Since(start); took > 10*time.Second+handoff.Grace {
			t.Errorf("Do returned after %v, past its 10s bound and the grace", took)
		}
		if ran || !errors.Is(err, guard.ErrNotAcquired) {
			t.Errorf("Do: %v, fn ran %v; want ErrNotAcquired and no run", err, ran)
		}
		if n := d.LateOnes(); n != 3 {
			t.Errorf("%d late grants, want 3: two given back and waited again after, one past the bound", n)
		}
		// The grant still on its way when the bound ran out is given back
		// once it is answered.
		time.Sleep(d.Late)
		synctest.Wait()
		free(t, other, "k", "after the bound")
	})
}

// TestLateGrantsPaced: a backend that grants at once leases that have
// already run out (a TTL below what its answer takes) is not asked again
// as fast as it answers: the waits after the first are paced, and the
// acquisition ends when ctx does, or with ErrUnavailable at its bound.
func TestLateGrantsPaced(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []guard.LockOption
		want error
		end  string // the last log line's account of the acquisition's end
	}{
		{"cancelled", nil, context.Canceled, "ends: its context is done"},
		{"bounded", []guard.LockOption{guard.WaitAtMost(time.Second)}, guard.ErrUnavailable, "ends: its bound has run out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &drivertest.LateGrants{Locker: memory.New(), Late: 2 * time.Microsecond}
				var log drivertest.LogBuffer
				g, err := guard.New(d, guard.WithTTL(time.Microsecond), guard.WithIdleCallers(0),
					guard.WithLogger(slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.opts == nil {
					time.AfterFunc(time.Second, cancel)
				}
				start := time.Now()
				l, err := g.Lock(ctx, "k", tc.opts...)
				if l != nil || !errors.Is(err, tc.want) {
					t.Errorf("Lock: %v, %v; want %v", l, err, tc.want)
				}
				if took := time.Since(start); took != time.Second {
					t.Errorf("Lock returned after %v, want 1s", took)
				}
				// Paced by pauses doubling from 1ms to 1s: about ten in a
				// second, where an unpaced loop makes one every 2µs.
				if n := d.LateOnes(); n > 100 {
					t.Errorf("%d late grants in a second: not paced", n)
				}
				// One warning an acquisition, its other late grants at
				// Debug, the last saying how it ended.
				lines := strings.Split(strings.TrimSpace(log.String()), "\n")
				if warns := strings.Count(log.String(), "level=WARN"); warns != 1 || len(lines) != d.LateOnes() || !strings.Contains(lines[len(lines)-1], tc.end) {
					t.Errorf("%d warnings, %d lines for %d late grants, last %q; want 1 warning, a line each, the last saying %q", warns, len(lines), d.LateOnes(), lines[len(lines)-1], tc.end)
				}
			})
		})
	}
}

// stuckReleases gives leases whose Release waits until release is closed.
type stuckReleases struct {
	*drivertest.LateGrants
	release chan struct{}
}

func (d stuckReleases) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	l, err := d.LateGrants.Acquire(ctx, key, o)
	if err != nil {
		return nil, err
	}
	return stuckRelease{l, d.release}, nil
}

type stuckRelease struct {
	driver.Lease
	release chan struct{}
}

func (l stuckRelease) Release(ctx context.Context) error {
	<-l.release
	return l.Lease.Release(ctx)
}

// TestCancelledWhileGivingBack: ctx ending while a late lease is being
// given back ends the acquisition with ctx's error: it does not wait again
// on a done ctx, nor start work on what that might grant.
func TestCancelledWhileGivingBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := stuckReleases{&drivertest.LateGrants{Locker: memory.New(), Late: 4 * time.Second, OnTimeAfter: 1}, make(chan struct{})}
		defer close(d.release)
		g, err := guard.New(d, guard.WithTTL(3*time.Second), guard.WithIdleCallers(0))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		time.AfterFunc(5*time.Second, cancel)
		ran := false
		err = g.Do(ctx, "k", func(context.Context, *guard.Lock) error {
			ran = true
			return nil
		})
		if ran || !errors.Is(err, context.Canceled) {
			t.Errorf("Do: %v, fn ran %v; want context.Canceled and no run", err, ran)
		}
	})
}

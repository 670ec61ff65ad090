package scheduler_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/scheduler"
)

// records returns the observer records so far.
func (j *journal) snapshot() []scheduler.RunRecord {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]scheduler.RunRecord(nil), j.records...)
}

// first waits for the first record with outcome o.
func (j *journal) first(t *testing.T, o scheduler.Outcome) scheduler.RunRecord {
	t.Helper()
	var found scheduler.RunRecord
	waitFor(t, "a run with outcome "+string(o), 15*time.Second, func() bool {
		for _, r := range j.snapshot() {
			if r.Outcome == o {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

// start runs fn every second on a new scheduler over g, stopped when t ends.
func start(t *testing.T, g *guard.Guard, name string, fn func(context.Context) error, opts ...scheduler.JobOption) *journal {
	t.Helper()
	j := new(journal)
	s := newScheduler(t, g, scheduler.WithInstance("solo"), scheduler.WithRunObserver(j.observe))
	if err := s.Add("@every 1s", name, fn, opts...); err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { stop(t, s) })
	return j
}

func TestHeldLockSkipsAndRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		held, err := g.Lock(context.Background(), "held")
		if err != nil {
			t.Fatal(err)
		}
		ran := make(chan struct{}, 10)
		j := start(t, g, "held", func(ctx context.Context) error { ran <- struct{}{}; return nil })
		r := j.first(t, scheduler.Skipped)
		if r.Reason != "lock held" || r.Instance != "solo" || r.Job != "held" || r.Slot.IsZero() {
			t.Errorf("skip recorded as %+v", r)
		}
		select {
		case <-ran:
			t.Fatal("job ran while its lock was held elsewhere")
		default:
		}
		held.Unlock(context.Background())
		j.first(t, scheduler.Ran)
	})
}

func TestPanicIsRecoveredAndReleasesTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		j := start(t, g, "panics", func(ctx context.Context) error { panic("boom") })
		r := j.first(t, scheduler.Failed)
		if !errors.Is(r.Err, scheduler.ErrPanicked) || !strings.Contains(r.Err.Error(), "boom") {
			t.Errorf("panic recorded as %v", r.Err)
		}
		waitFor(t, "the lock to be free after the panic", 5*time.Second, func() bool {
			l, err := g.TryLock(context.Background(), "panics")
			if err != nil {
				return false
			}
			l.Unlock(context.Background())
			return true
		})
	})
}

// A job that ends its goroutine with runtime.Goexit (t.FailNow in a job
// under test) has its run ended all the same: a failed outcome with
// ErrExited, the lock released, and the following slots run.
func TestGoexitEndsTheRunAndReleasesTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		var n atomic.Int32
		j := start(t, g, "exits", func(ctx context.Context) error {
			if n.Add(1) == 1 {
				runtime.Goexit()
			}
			return nil
		})
		r := j.first(t, scheduler.Failed)
		if !errors.Is(r.Err, scheduler.ErrExited) {
			t.Errorf("Goexit recorded as %v", r.Err)
		}
		j.first(t, scheduler.Ran)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		for _, r := range j.snapshot() {
			if r.Outcome == scheduler.Skipped {
				t.Errorf("slot %v skipped after the Goexit: %s", r.Slot, r.Reason)
			}
		}
	})
}

func TestLockAtMostForCancelsTheJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		cause := make(chan error, 10)
		j := start(t, g, "capped", func(ctx context.Context) error {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return ctx.Err()
		}, scheduler.LockAtMostFor(200*time.Millisecond))
		r := j.first(t, scheduler.Failed)
		if err := <-cause; !errors.Is(err, scheduler.ErrLockAtMostFor) {
			t.Errorf("cause %v, want ErrLockAtMostFor", err)
		}
		if d := r.Finished.Sub(r.Started); d < 200*time.Millisecond {
			t.Errorf("run ended after %v, before its cap", d)
		}
	})
}

func TestLockAtLeastForKeepsTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		atLeast := 700 * time.Millisecond
		j := start(t, g, "short", func(ctx context.Context) error { return nil }, scheduler.LockAtLeastFor(atLeast))
		r := j.first(t, scheduler.Ran)
		// The observer is told when the job returns, before the hold ends.
		if _, err := g.TryLock(context.Background(), "short"); !errors.Is(err, guard.ErrNotAcquired) {
			t.Errorf("TryLock right after a short run: %v, want ErrNotAcquired", err)
		}
		waitFor(t, "the lock to be released after LockAtLeastFor", 5*time.Second, func() bool {
			l, err := g.TryLock(context.Background(), "short")
			if err != nil {
				return false
			}
			l.Unlock(context.Background())
			if held := time.Since(r.Started); held < atLeast {
				t.Errorf("lock free %v after the run started, before LockAtLeastFor %v", held, atLeast)
			}
			return true
		})
	})
}

func TestMisfireAfterWaitingForTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker := memory.New()
		g := newGuard(t, locker)
		held, err := g.Lock(context.Background(), "late")
		if err != nil {
			t.Fatal(err)
		}
		ran := make(chan struct{}, 10)
		j := start(t, g, "late", func(ctx context.Context) error { ran <- struct{}{}; return nil },
			scheduler.WaitForLock(5*time.Second), scheduler.MisfireAfter(300*time.Millisecond))
		waitFor(t, "a run waiting for the lock", 10*time.Second, func() bool { return locker.Waiters("warden:late") > 0 })
		// The waiter started at or after its slot, so after this it is late by
		// more than the bound whatever the machine's speed.
		time.Sleep(500 * time.Millisecond)
		held.Unlock(context.Background())
		r := j.first(t, scheduler.Misfired)
		if !strings.Contains(r.Reason, "after its slot") {
			t.Errorf("misfire recorded as %+v", r)
		}
		if len(j.snapshot()) > 0 && j.snapshot()[0].Outcome != scheduler.Misfired {
			t.Errorf("first run %s, want misfired", j.snapshot()[0].Outcome)
		}
	})
}

func TestStopCancelsRunningJobsAndReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		var j journal
		s := newScheduler(t, g, scheduler.WithRunObserver(j.observe))
		started := make(chan struct{}, 1)
		cause := make(chan error, 1)
		if err := s.Add("@every 2h", "stopped", func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return ctx.Err()
		}, scheduler.LockAtLeastFor(time.Hour)); err != nil {
			t.Fatal(err)
		}
		s.Start()
		<-started
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// LockAtLeastFor is an hour: Stop cuts the hold short rather than
		// waiting for it, and returns once the lock is released.
		if err := s.Stop(ctx); err != nil {
			t.Errorf("Stop: %v, want nil (the hold cut short, the lock released)", err)
		}
		if err := <-cause; !errors.Is(err, scheduler.ErrStopped) {
			t.Errorf("cause %v, want ErrStopped", err)
		}
		l, err := g.TryLock(context.Background(), "stopped")
		if err != nil {
			t.Fatalf("lock not released by Stop: %v", err)
		}
		l.Unlock(context.Background())
	})
}

// A job stops its own Scheduler the way Stop's doc says, on a goroutine of
// its own: Stop cancels the job, waits for it to return and release its
// lock, and returns nil.
func TestStopFromAJobOnItsOwnGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		s := newScheduler(t, g)
		stopped := make(chan error, 1)
		var once sync.Once
		if err := s.Add("@every 1s", "last", func(ctx context.Context) error {
			once.Do(func() { go func() { stopped <- s.Stop(context.Background()) }() })
			<-ctx.Done()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		s.Start()
		if err := <-stopped; err != nil {
			t.Errorf("Stop: %v", err)
		}
		if held := g.Held(); len(held) != 0 {
			t.Errorf("locks still held after Stop: %v", held)
		}
	})
}

// TestLockLossCancelsTheJob takes the job's lock away on the server, as an
// operator or an expired lease would, and expects the job's context to be
// cancelled with ErrLockLost. Memory is not in it: an in-process lease is
// only lost by outliving its TTL unrefreshed, which guard's lease keeper
// does not let happen short of a stalled process. Nor are etcd and
// ZooKeeper: their locks are kept by the session, with no request per lock,
// so a key or node deleted behind the holder's back is found only at
// release (guard's tests show that Do then reports the loss).
func TestLockLossCancelsTheJob(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(b backend) bool { return b.name != "memory" && b.name != "etcd" && b.name != "zk" }, func(t *testing.T, b backend) {
		c := b.setup(t)
		name := uniqueName("stolen")
		started := make(chan struct{}, 1)
		cause := make(chan error, 1)
		// Later runs, after the loss, must not block on the channels: Stop
		// waits for them.
		j := start(t, c.node(t), name, func(ctx context.Context) error {
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Second):
			}
			select {
			case cause <- context.Cause(ctx):
			default:
			}
			return nil
		}, scheduler.LockTTL(c.ttl))
		select {
		case <-started:
		case <-time.After(15 * time.Second):
			t.Fatal("the job did not start")
		}
		c.steal(t, name)
		select {
		case err := <-cause:
			if !errors.Is(err, guard.ErrLockLost) {
				t.Errorf("cause %v, want ErrLockLost", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the job's context was not cancelled")
		}
		r := j.first(t, scheduler.Lost)
		if !errors.Is(r.Err, guard.ErrLockLost) || r.Token == 0 {
			t.Errorf("loss recorded as %+v", r)
		}
	})
}

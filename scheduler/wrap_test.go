package scheduler_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/scheduler"
)

func TestWrapSkipsWhileHeldAndReleasesAfterPanic(t *testing.T) {
	t.Parallel()
	g := newGuard(t, memory.New())
	var runs atomic.Int32
	job := scheduler.Wrap(g, "wrapped")(cron.FuncJob(func() {
		runs.Add(1)
		panic("boom")
	}))
	held, err := g.Lock(context.Background(), "wrapped")
	if err != nil {
		t.Fatal(err)
	}
	job.Run()
	if n := runs.Load(); n != 0 {
		t.Fatalf("job ran %d times while its lock was held", n)
	}
	held.Unlock(context.Background())
	job.Run() // panics inside; must not escape
	if n := runs.Load(); n != 1 {
		t.Fatalf("job ran %d times, want 1", n)
	}
	l, err := g.TryLock(context.Background(), "wrapped")
	if err != nil {
		t.Fatalf("lock not released after the panic: %v", err)
	}
	l.Unlock(context.Background())
}

func TestWrapLockAtLeastFor(t *testing.T) {
	t.Parallel()
	g := newGuard(t, memory.New())
	start := time.Now()
	scheduler.Wrap(g, "brief", scheduler.LockAtLeastFor(300*time.Millisecond))(cron.FuncJob(func() {})).Run()
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("lock released %v after it was taken, before LockAtLeastFor", d)
	}
}

// TestGocronLocker: two gocron schedulers share one job through a Guard;
// their runs never overlap.
func TestGocronLocker(t *testing.T) {
	t.Parallel()
	locker := memory.New()
	var running, maxRunning, runs atomic.Int32
	task := func() {
		n := running.Add(1)
		for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
		}
		runs.Add(1)
		time.Sleep(300 * time.Millisecond) // the job's work
		running.Add(-1)
	}
	var schedulers []gocron.Scheduler
	for range 2 {
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(scheduler.Locker(newGuard(t, locker), 200*time.Millisecond)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.NewJob(gocron.DurationJob(500*time.Millisecond), gocron.NewTask(task), gocron.WithName("gocron-job")); err != nil {
			t.Fatal(err)
		}
		schedulers = append(schedulers, s)
	}
	for _, s := range schedulers {
		s.Start()
	}
	waitFor(t, "three runs", 15*time.Second, func() bool { return runs.Load() >= 3 })
	for _, s := range schedulers {
		if err := s.Shutdown(); err != nil {
			t.Error(err)
		}
	}
	if m := maxRunning.Load(); m > 1 {
		t.Errorf("%d runs at once", m)
	}
	// The lock is free again once the hold is over.
	g := newGuard(t, locker)
	waitFor(t, "the lock to be free", 5*time.Second, func() bool {
		l, err := g.TryLock(context.Background(), "gocron-job")
		if err != nil {
			return false
		}
		l.Unlock(context.Background())
		return true
	})
}

package scheduler_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

// stoppedScheduler is a quiet Scheduler stopped when t ends.
func stoppedScheduler(t *testing.T, g *guard.Guard, opts ...scheduler.Option) *scheduler.Scheduler {
	t.Helper()
	s := newScheduler(t, g, opts...)
	t.Cleanup(func() { s.Stop(context.Background()) })
	return s
}

func TestWrapSkipsWhileHeldAndReleasesAfterPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		var records []scheduler.RunRecord
		s := stoppedScheduler(t, g, scheduler.WithRunObserver(func(r scheduler.RunRecord) { records = append(records, r) }))
		wrap, err := s.Wrap("wrapped", scheduler.LockAtLeastFor(0))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		job := wrap(cron.FuncJob(func() {
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
		if len(records) != 2 || records[0].Outcome != scheduler.Skipped || records[1].Outcome != scheduler.Failed ||
			!errors.Is(records[1].Err, scheduler.ErrPanicked) {
			t.Errorf("records %+v, want a skipped run, then a failed one with ErrPanicked", records)
		}
	})
}

func TestWrapAndLockerRefuseBadOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := stoppedScheduler(t, newGuard(t, memory.New()))
		bad := []scheduler.JobOption{scheduler.LockAtMostFor(time.Minute), scheduler.LockAtLeastFor(time.Hour)}
		if _, err := s.Wrap("job", bad...); !errors.Is(err, scheduler.ErrInvalidJob) {
			t.Errorf("Wrap: %v, want ErrInvalidJob", err)
		}
		if _, err := s.Wrap("bad\x00name"); !errors.Is(err, scheduler.ErrInvalidJob) {
			t.Errorf("Wrap with a control character in the name: %v, want ErrInvalidJob", err)
		}
		if _, err := s.Locker(bad...); !errors.Is(err, scheduler.ErrInvalidJob) {
			t.Errorf("Locker: %v, want ErrInvalidJob", err)
		}
		if _, err := s.Wrap("twice"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Wrap("twice"); !errors.Is(err, scheduler.ErrDuplicateJob) {
			t.Errorf("a second Wrap of one name: %v, want ErrDuplicateJob", err)
		}
	})
}

// skewedNode is one of two processes sharing a lock backend, the second
// with its clock 400ms behind the first's.
func skewedNodes(t *testing.T, opts ...scheduler.Option) [2]*scheduler.Scheduler {
	locker := memory.New()
	var nodes [2]*scheduler.Scheduler
	for i := range nodes {
		skew := time.Duration(i) * -400 * time.Millisecond
		clock := func() time.Time { return time.Now().Add(skew) }
		nodes[i] = stoppedScheduler(t, newGuard(t, locker), append(opts, scheduler.WithClock(clock))...)
	}
	return nodes
}

// With default options, a short wrapped job never runs twice for one tick
// across two processes whose clocks are 400ms apart: robfig/cron fires the
// second one 400ms later in real time, after the first run has ended.
func TestWrapDefaultsNeverRunATickTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nodes := skewedNodes(t)
		var runs atomic.Int32
		var crons []*cron.Cron
		for i, s := range nodes {
			wrap, err := s.Wrap("report")
			if err != nil {
				t.Fatal(err)
			}
			c := cron.New(cron.WithSeconds())
			delay := time.Duration(i) * 400 * time.Millisecond
			// The second node's cron fires when its own clock shows the
			// second: 400ms after the first's in real time.
			late := func(j cron.Job) cron.Job {
				return cron.FuncJob(func() { time.Sleep(delay); j.Run() })
			}
			if _, err := c.AddJob("*/2 * * * * *", cron.NewChain(late, wrap).Then(cron.FuncJob(func() { runs.Add(1) }))); err != nil {
				t.Fatal(err)
			}
			crons = append(crons, c)
		}
		for _, c := range crons {
			c.Start()
		}
		start := time.Now()
		time.Sleep(7 * time.Second) // the observation window: three or four ticks
		for _, c := range crons {
			<-c.Stop().Done()
		}
		ticks := int32(time.Since(start)/(2*time.Second)) + 1
		if n := runs.Load(); n > ticks || n < ticks-2 {
			t.Errorf("%d runs in %d ticks across two nodes, want one per tick", n, ticks)
		}
	})
}

// The gocron Locker, with default options, keeps a short run's lock past the
// moment a node 400ms behind asks for it.
func TestLockerDefaultsNeverRunATickTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nodes := skewedNodes(t)
		var lockers [2]gocron.Locker
		for i, s := range nodes {
			l, err := s.Locker()
			if err != nil {
				t.Fatal(err)
			}
			lockers[i] = l
		}
		ctx := context.Background()
		for range 3 {
			// The previous round's hold ends after DefaultLockAtLeastFor.
			var first gocron.Lock
			waitFor(t, "the first node to take the lock", 10*time.Second, func() bool {
				l, err := lockers[0].Lock(ctx, "gocron-report")
				first = l
				return err == nil
			})
			first.Unlock(ctx) // a short job
			time.Sleep(400 * time.Millisecond)
			second, err := lockers[1].Lock(ctx, "gocron-report")
			if err == nil {
				second.Unlock(ctx)
				t.Fatal("the node 400ms behind ran the tick again")
			}
			if !errors.Is(err, guard.ErrNotAcquired) {
				t.Fatalf("the second node: %v, want ErrNotAcquired", err)
			}
		}
	})
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
		l, err := stoppedScheduler(t, newGuard(t, locker)).Locker(scheduler.LockAtLeastFor(200 * time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
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

// WrapSpec names a firing's slot from the job's spec: a firing that reaches
// the wrapper 1.5s late (a stalled process, a DelayIfStillRunning ahead of
// it) names the slot it was for, which the other node ran, and is skipped,
// where Wrap would name the second after it, a slot of its own, and run
// the tick again.
func TestWrapSpecNamesALateFiringsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var runs atomic.Int32
		var crons []*cron.Cron
		for i := range 2 {
			s := stoppedScheduler(t, newGuard(t, locker), scheduler.WithSlotStore(store))
			wrap, err := s.WrapSpec("*/5 * * * * *", "report")
			if err != nil {
				t.Fatal(err)
			}
			delay := time.Duration(i) * 1500 * time.Millisecond
			late := func(j cron.Job) cron.Job {
				return cron.FuncJob(func() { time.Sleep(delay); j.Run() })
			}
			c := cron.New(cron.WithSeconds())
			if _, err := c.AddJob("*/5 * * * * *", cron.NewChain(late, wrap).Then(cron.FuncJob(func() { runs.Add(1) }))); err != nil {
				t.Fatal(err)
			}
			crons = append(crons, c)
		}
		for _, c := range crons {
			c.Start()
		}
		start := time.Now()
		time.Sleep(22 * time.Second)
		for _, c := range crons {
			<-c.Stop().Done()
		}
		// synctest's clock starts on a whole second: the ticks in the
		// window are those at multiples of 5s after the first.
		ticks := int32(0)
		for tk := start.Truncate(5 * time.Second); !tk.After(start.Add(22 * time.Second)); tk = tk.Add(5 * time.Second) {
			if tk.After(start) {
				ticks++
			}
		}
		if n := runs.Load(); n != ticks {
			t.Errorf("%d runs in %d ticks across two nodes, one of them 1.5s late, want one per tick", n, ticks)
		}
	})
}

// WrapSpec refuses what Add refuses: a spec that does not parse, or that
// never fires.
func TestWrapSpecRefusesBadSpecs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := stoppedScheduler(t, newGuard(t, memory.New()))
		for _, spec := range []string{"", "* * *", "0 0 30 2 *", "@every 1ms", "@every 1500ms", "@every 100ms"} {
			if _, err := s.WrapSpec(spec, "job"); !errors.Is(err, scheduler.ErrInvalidJob) {
				t.Errorf("WrapSpec(%q): %v, want ErrInvalidJob", spec, err)
			}
		}
		// robfig/cron fires "@every" on whole seconds: slots off them
		// would not be its firings'.
		off := stoppedScheduler(t, newGuard(t, memory.New()), scheduler.WithAnchor(time.Unix(0, 2e6)))
		if _, err := off.WrapSpec("@every 1s", "job"); !errors.Is(err, scheduler.ErrInvalidJob) || !strings.Contains(err.Error(), "anchor") {
			t.Errorf("WrapSpec(\"@every 1s\") with an anchor off the second: %v, want ErrInvalidJob naming the anchor", err)
		}
	})
}

// WrapSpec aligns "@every D" slots to the Scheduler's anchor: robfig/cron
// fires such a job D apart from when each process started its cron, and
// two processes started 3s apart name the same slot for the firings of one
// period, so the job runs once a period, where Wrap names each firing's
// second and runs it twice.
func TestWrapSpecAlignsEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var runs atomic.Int32
		var crons []*cron.Cron
		for range 2 {
			s := stoppedScheduler(t, newGuard(t, locker), scheduler.WithSlotStore(store))
			wrap, err := s.WrapSpec("@every 10s", "sweep")
			if err != nil {
				t.Fatal(err)
			}
			c := cron.New()
			if _, err := c.AddJob("@every 10s", cron.NewChain(wrap).Then(cron.FuncJob(func() { runs.Add(1) }))); err != nil {
				t.Fatal(err)
			}
			crons = append(crons, c)
		}
		// synctest's clock starts on a multiple of 10s since the epoch,
		// the anchor's slots: the first cron fires at 10s, 20s and 30s,
		// the second, started 3s later, at 13s, 23s and 33s.
		crons[0].Start()
		time.Sleep(3 * time.Second)
		crons[1].Start()
		time.Sleep(32 * time.Second)
		for _, c := range crons {
			<-c.Stop().Done()
		}
		if n := runs.Load(); n != 3 {
			t.Errorf("%d runs in three periods of two crons started 3s apart, want 3", n)
		}
	})
}

// A firing far from every slot of its spec (a cron reading the spec in
// another zone than the Scheduler's) is told at Warn: the slot it takes,
// the one before it, may have run already, and its run is then skipped.
func TestWrapSpecTellsAFiringOffItsSpec(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs drivertest.LogBuffer
		s := stoppedScheduler(t, newGuard(t, memory.New()), scheduler.WithLocation(time.UTC),
			scheduler.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		wrap, err := s.WrapSpec("0 8,9 * * *", "report")
		if err != nil {
			t.Fatal(err)
		}
		job := wrap(cron.FuncJob(func() {}))
		const warning = "a firing came long after the latest slot"
		// synctest's clock starts at midnight UTC: 08:00 UTC is a slot.
		time.Sleep(8 * time.Hour)
		job.Run()
		if strings.Contains(logs.String(), warning) {
			t.Fatalf("a firing on its slot was told as off its spec: %s", logs.String())
		}
		// 08:00 in Asia/Kolkata, where a cron in that zone fires.
		time.Sleep(18*time.Hour + 30*time.Minute)
		job.Run()
		if !strings.Contains(logs.String(), warning) {
			t.Errorf("a firing 17h30m after its spec's latest slot was not told: %s", logs.String())
		}
	})
}

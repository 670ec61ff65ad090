package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

func newMemoryScheduler(t *testing.T, opts ...scheduler.Option) (*scheduler.Scheduler, *guard.Guard) {
	t.Helper()
	g, err := guard.New(memory.New(), guard.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s, err := scheduler.New(g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s, g
}

// Schedules and bounds are checked when a job is added, and refused with an
// error naming the problem, never silently changed.
func TestAddRefusesWhatItCannotHonour(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newMemoryScheduler(t)
		noop := func(context.Context) error { return nil }
		for _, tc := range []struct {
			spec string
			opts []scheduler.JobOption
			want string
		}{
			{"@every 0s", nil, "shorter than the minimum"},
			{"@every -1s", nil, "shorter than the minimum"},
			{"@every 1ms", nil, "shorter than the minimum"},
			{"@every soon", nil, "invalid duration"},
			{"CRON_TZ=UTC @every 10ms", nil, "shorter than the minimum"},
			{"TZ=UTC\t@every 1ms", nil, "shorter than the minimum"},
			{"CRON_TZ=Nowhere/Atlantis @every 1s", nil, "unknown time zone"},
			{"CRON_TZ=UTC", nil, "no schedule"},
			{"@every 1s 2s", nil, "one duration"},
			{"* * *", nil, "spec"},
			{"0 0 30 2 *", nil, "never fires"},
			{"CRON_TZ=Europe/Paris 0 0 12 31 4 *", nil, "never fires"},
			{"@every 1s", []scheduler.JobOption{scheduler.LockAtMostFor(time.Minute), scheduler.LockAtLeastFor(time.Hour)}, "longer than LockAtMostFor"},
			{"@every 1s", []scheduler.JobOption{scheduler.LockAtMostFor(0)}, "LockAtMostFor"},
			{"@every 1s", []scheduler.JobOption{scheduler.LockAtLeastFor(time.Second)}, "LockAtLeastFor 1s is not shorter than the 1s between two of its slots"},
			{"*/5 * * * * *", []scheduler.JobOption{scheduler.LockAtLeastFor(6 * time.Second)}, "not shorter than the 5s"},
			{"@every 1s", []scheduler.JobOption{scheduler.WaitForLock(-time.Second)}, "WaitForLock"},
			{"@every 1s", []scheduler.JobOption{scheduler.LockTTL(5)}, "LockTTL 5ns is neither 0"},
			{"@every 1s", []scheduler.JobOption{scheduler.CatchUp(), scheduler.MisfireAfter(time.Second)}, "CatchUp needs a slot store"},
		} {
			err := s.Add(tc.spec, "job", noop, tc.opts...)
			if !errors.Is(err, scheduler.ErrInvalidJob) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Add(%q): %v, want ErrInvalidJob naming %q", tc.spec, err, tc.want)
			}
		}
		if err := s.Add("@every 1s", "nil", nil); !errors.Is(err, scheduler.ErrInvalidJob) {
			t.Errorf("Add with a nil func: %v, want ErrInvalidJob", err)
		}
		stored, _ := newMemoryScheduler(t, scheduler.WithSlotStore(idempotency.NewMemoryStore()))
		if err := stored.Add("@every 1s", "job", noop, scheduler.CatchUp()); !errors.Is(err, scheduler.ErrInvalidJob) || !strings.Contains(err.Error(), "MisfireAfter") {
			t.Errorf("CatchUp without MisfireAfter: %v, want ErrInvalidJob naming MisfireAfter", err)
		}
		if err := stored.Add("@every 1s", "job", noop, scheduler.CatchUp(), scheduler.MisfireAfter(time.Second)); !errors.Is(err, scheduler.ErrInvalidJob) || !strings.Contains(err.Error(), "no time to catch a slot up") {
			t.Errorf("CatchUp with a MisfireAfter shorter than two claim leases: %v, want ErrInvalidJob saying why", err)
		}
		if err := stored.Add("@every 1m", "job", noop, scheduler.CatchUp(), scheduler.MisfireAfter(30*time.Second)); err != nil {
			t.Errorf("CatchUp with a store and a long enough MisfireAfter: %v", err)
		}
	})
}

// wholeSeconds is a backend that, like etcd, counts TTLs in whole seconds
// from 2s.
type wholeSeconds struct{ *memory.Locker }

func (wholeSeconds) Limits() driver.Limits {
	return driver.Limits{MinTTL: 2 * time.Second, TTLStep: time.Second}
}

func TestLockTTLCheckedAgainstTheBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, err := guard.New(wholeSeconds{memory.New()}, guard.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		s, err := scheduler.New(g)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Add("@every 1s", "job", func(context.Context) error { return nil }, scheduler.LockTTL(1500*time.Millisecond))
		if !errors.Is(err, scheduler.ErrInvalidJob) || !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("LockTTL(1.5s) on a backend of whole seconds: %v, want ErrInvalidJob and ErrInvalidOption", err)
		}
	})
}

// "@every 1500ms" means 1.5 s between slots, not 1 s.
func TestEveryHonoursSubSecondIntervals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newMemoryScheduler(t)
		var mu sync.Mutex
		var slots []time.Time
		err := s.Add("@every 1500ms", "every-1500ms", func(ctx context.Context) error {
			run, _ := scheduler.RunFrom(ctx)
			mu.Lock()
			slots = append(slots, run.Slot)
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		defer s.Stop(context.Background())
		deadline := time.Now().Add(20 * time.Second)
		for {
			mu.Lock()
			n := len(slots)
			mu.Unlock()
			if n >= 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d runs in 20s", n)
			}
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		for i := 1; i < len(slots); i++ {
			if d := slots[i].Sub(slots[i-1]); d != 1500*time.Millisecond {
				t.Errorf("slots %v and %v are %v apart, want 1.5s", slots[i-1], slots[i], d)
			}
			if slots[i].UnixMilli()%1500 != 0 {
				t.Errorf("slot %v is not aligned to 1.5s since the anchor", slots[i])
			}
		}
	})
}

// Stop returns promptly when a job sits in its LockAtLeastFor hold, and
// releases that hold.
func TestStopReleasesTheAtLeastHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, g := newMemoryScheduler(t)
		ran := make(chan struct{}, 1)
		err := s.Add("@every 2h", "held", func(context.Context) error {
			select {
			case ran <- struct{}{}:
			default:
			}
			return nil
		}, scheduler.LockAtLeastFor(time.Hour), scheduler.LockAtMostFor(2*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		select {
		case <-ran:
		case <-time.After(3 * time.Hour):
			t.Fatal("the job did not run")
		}
		start := time.Now()
		if err := s.Stop(context.Background()); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("Stop took %v with a job in its LockAtLeastFor hold", took)
		}
		l, err := g.TryLock(context.Background(), "held")
		if err != nil {
			t.Fatalf("the hold was not released by Stop: %v", err)
		}
		l.Unlock(context.Background())
	})
}

// Entries lists every job with its schedule, its next slot while the
// Scheduler runs, and its latest run.
func TestEntries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newMemoryScheduler(t)
		ran := make(chan struct{}, 16)
		if err := s.Add("@every 200ms", "tick", func(context.Context) error {
			ran <- struct{}{}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.Add("0 3 * * *", "nightly", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		before := s.Entries()
		if len(before) != 2 || before[0].Name != "tick" || before[1].Spec != "0 3 * * *" ||
			!before[0].Next.IsZero() || before[0].Last != nil {
			t.Fatalf("before Start: %+v", before)
		}
		s.Start()
		t.Cleanup(func() { s.Stop(context.Background()) })
		select {
		case <-ran:
		case <-time.After(30 * time.Second):
			t.Fatal("the job never ran")
		}
		waitFor(t, "the first run to be recorded", 30*time.Second, func() bool {
			e := s.Entries()
			return e[0].Last != nil && e[0].Last.Outcome == scheduler.Ran
		})
		now := time.Now()
		for _, e := range s.Entries() {
			if !e.Next.After(now.Add(-time.Second)) {
				t.Errorf("%s: next slot %v, want one ahead of %v", e.Name, e.Next, now)
			}
		}
		if e := s.Entries()[1]; e.Next.Hour() != 3 || e.Next.Minute() != 0 || e.Last != nil {
			t.Errorf("nightly: %+v, want next at 03:00 and no run yet", e)
		}
	})
}

// TestAddRefusesBoundsTooLongToLeaseAClaim: with a slot store, a claim is
// leased for the wait for the lock plus the cap on the run; bounds whose
// sum is past the largest Duration (LockAtMostFor(math.MaxInt64) for "no
// cap") are refused at Add, not failed by the store at every slot.
func TestAddRefusesBoundsTooLongToLeaseAClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newMemoryScheduler(t, scheduler.WithSlotStore(idempotency.NewMemoryStore()))
		noop := func(context.Context) error { return nil }
		for i, opts := range [][]scheduler.JobOption{
			{scheduler.LockAtMostFor(math.MaxInt64)},
			{scheduler.WaitForLock(math.MaxInt64)},
			{scheduler.LockAtMostFor(math.MaxInt64 / 2), scheduler.WaitForLock(math.MaxInt64 / 2)},
		} {
			if err := s.Add("@every 1s", fmt.Sprint("job", i), noop, opts...); !errors.Is(err, scheduler.ErrInvalidJob) || !strings.Contains(err.Error(), "too long to lease") {
				t.Errorf("Add #%d: %v, want ErrInvalidJob saying the bounds are too long", i, err)
			}
		}
		if err := s.Add("@every 1s", "job", noop, scheduler.LockAtMostFor(100*365*24*time.Hour)); err != nil {
			t.Errorf("a cap of a century: %v", err)
		}
		// Under CatchUp a claim lives a lock TTL: one past half the
		// largest Duration wrapped the check that MisfireAfter leaves
		// time to catch a slot up, and a dead runner's slot was never
		// caught up.
		if err := s.Add("@every 1s", "catchup", noop, scheduler.CatchUp(), scheduler.LockTTL(math.MaxInt64/2+time.Second), scheduler.MisfireAfter(time.Hour)); !errors.Is(err, scheduler.ErrInvalidJob) || !strings.Contains(err.Error(), "no time to catch") {
			t.Errorf("CatchUp with a lock TTL of centuries: %v, want ErrInvalidJob saying it leaves no time to catch a slot up", err)
		}
	})
}

// TestAddRefusesTheElectionsLockName: under WithLeaderElection("main") the
// leader holds the lock "election:main"; a job of that name was skipped as
// "lock held" at every slot, by its own leader.
func TestAddRefusesTheElectionsLockName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newMemoryScheduler(t, scheduler.WithLeaderElection("main"))
		noop := func(context.Context) error { return nil }
		if err := s.Add("@every 1s", "election:main", noop); !errors.Is(err, scheduler.ErrInvalidJob) || !strings.Contains(err.Error(), "leader election") {
			t.Errorf("Add: %v, want ErrInvalidJob naming the leader election", err)
		}
		if _, err := s.Wrap("election:main"); !errors.Is(err, scheduler.ErrInvalidJob) {
			t.Errorf("Wrap: %v, want ErrInvalidJob", err)
		}
		if err := s.Add("@every 1s", "election:other", noop); err != nil {
			t.Errorf("a job named after another election: %v", err)
		}
	})
}

// TestNewNamesTheSchedulerInItsRefusals: New's refusals, like its options',
// say that the scheduler refused, and match guard.ErrInvalidOption.
func TestNewNamesTheSchedulerInItsRefusals(t *testing.T) {
	g := newGuard(t, memory.New())
	for name, f := range map[string]func() error{
		"nil Guard":     func() error { _, err := scheduler.New(nil); return err },
		"nil clock":     func() error { _, err := scheduler.New(g, scheduler.WithClock(nil)); return err },
		"nil slotstore": func() error { _, err := scheduler.New(g, scheduler.WithSlotStore(nil)); return err },
	} {
		if err := f(); !errors.Is(err, guard.ErrInvalidOption) || !strings.Contains(err.Error(), "scheduler: ") {
			t.Errorf("New with a %s: %v; want ErrInvalidOption, naming the scheduler", name, err)
		}
	}
}

// TestStopWithADoneContextWhenNothingRuns: a Stop whose ctx is already done
// reports success when no job is left running, rather than ctx's error.
func TestStopWithADoneContextWhenNothingRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := newMemoryScheduler(t)
		if err := s.Add("@every 1m", "idle", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		s.Start()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("Stop(cancelled ctx) with nothing running: %v, want nil", err)
		}
	})
}

// TestLockGrantedAfterItsLeaseRanOut: a job whose lock is granted only
// after its lease ran out (which guard refuses) does not start on it; the
// run is recorded failed on its lock, and the slot given back, not
// recorded as run.
func TestLockGrantedAfterItsLeaseRanOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, err := guard.New(&drivertest.LateGrants{Locker: memory.New(), Late: 4 * time.Second}, guard.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		store := idempotency.NewMemoryStore()
		s, err := scheduler.New(g, scheduler.WithSlotStore(store))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		if err := s.Add("@every 1m", "late", func(context.Context) error {
			runs.Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		s.Start()
		time.Sleep(70 * time.Second)
		if err := s.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := runs.Load(); n != 0 {
			t.Errorf("the job ran %d times on a lock granted after its lease ran out, want 0", n)
		}
		last := s.Entries()[0].Last
		if last == nil {
			t.Fatal("no run recorded")
		}
		if last.Outcome != scheduler.Failed || !strings.Contains(last.Reason, "lock") {
			t.Errorf("last run: %+v, want failed on its lock", last)
		}
		if rec, err := store.Get(context.Background(), "warden.scheduler", "late@"+last.Slot.UTC().Format(time.RFC3339Nano)); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("the slot of the run that never started: %+v, %v; want it given back (not found)", rec, err)
		}
	})
}

// slowCompletes is the memory store whose completions take delay, and
// counts those that finished.
type slowCompletes struct {
	idempotency.Store
	delay    time.Duration
	finished atomic.Int32
}

func (s *slowCompletes) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	time.Sleep(s.delay)
	err := s.Store.Complete(ctx, scope, key, owner, response, retention)
	s.finished.Add(1)
	return err
}

// TestStopWithADoneContextWaitsForTheSlotsCompletion: a Stop whose ctx is
// done, whose runs all end within its grace, waits for their slots'
// completions too (within the same grace) before it reports success, so
// that a caller who then closes the store does not cut one short.
func TestStopWithADoneContextWaitsForTheSlotsCompletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &slowCompletes{Store: idempotency.NewMemoryStore(), delay: 300 * time.Millisecond}
		s, _ := runningUntilStopped(t, store)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("Stop(cancelled ctx), the run ending at once: %v, want nil", err)
		}
		if n := store.finished.Load(); n != 1 {
			t.Errorf("slot completions finished when Stop returned: %d, want 1", n)
		}
	})
}

// TestStopWithADoneContextAndAHungStore: a Stop whose ctx is done, whose
// runs all returned, reports what a Stop whose ctx is not done reports,
// nil, once the store calls they left behind have had the grace, even when
// the store never answers them: the jobs returned.
func TestStopWithADoneContextAndAHungStore(t *testing.T) {
	for _, done := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			s, g := runningUntilStopped(t, &slowCompletes{Store: idempotency.NewMemoryStore(), delay: time.Hour})
			ctx, cancel := context.WithCancel(context.Background())
			if done {
				cancel()
			}
			defer cancel()
			start := time.Now()
			if err := s.Stop(ctx); err != nil {
				t.Errorf("Stop, ctx done %v, the job returned, the store hung: %v, want nil", done, err)
			}
			if d := time.Since(start); d != g.ReleaseTimeout() {
				t.Errorf("Stop, ctx done %v: returned after %v, want the grace, %v", done, d, g.ReleaseTimeout())
			}
			time.Sleep(time.Hour) // the hung completion's end
		})
	}
}

// runningUntilStopped starts a Scheduler on store with a job that runs
// until its context ends, and returns once the job runs.
func runningUntilStopped(t *testing.T, store idempotency.Store) (*scheduler.Scheduler, *guard.Guard) {
	t.Helper()
	s, g := newMemoryScheduler(t, scheduler.WithSlotStore(store))
	started := make(chan struct{}, 1)
	if err := s.Add("@every 1m", "blocks", func(ctx context.Context) error {
		started <- struct{}{}
		<-ctx.Done()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s.Start()
	<-started
	return s, g
}

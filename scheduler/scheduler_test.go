package scheduler_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/scheduler"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// execution is one call of a job function.
type execution struct {
	slot       time.Time
	instance   string
	start, end time.Time // real time
}

// journal collects what the nodes of one test did.
type journal struct {
	mu      sync.Mutex
	execs   []execution
	records []scheduler.RunRecord
}

func (j *journal) observe(r scheduler.RunRecord) {
	j.mu.Lock()
	j.records = append(j.records, r)
	j.mu.Unlock()
}

// job returns a job function that records its executions and works for d.
func (j *journal) job(d time.Duration) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		run, ok := scheduler.RunFrom(ctx)
		if !ok || run.Lock == nil || run.Lock.Err() != nil {
			return errors.New("job context carries no held lock")
		}
		e := execution{slot: run.Slot, instance: run.Instance, start: time.Now()}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		e.end = time.Now()
		j.mu.Lock()
		j.execs = append(j.execs, e)
		j.mu.Unlock()
		return nil
	}
}

// slotsSeenByAll returns the slots every one of n nodes has an outcome for.
func (j *journal) slotsSeenByAll(n int) []time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	count := map[time.Time]int{}
	for _, r := range j.records {
		count[r.Slot.UTC()]++
	}
	var slots []time.Time
	for s, c := range count {
		if c >= n {
			slots = append(slots, s)
		}
	}
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	return slots
}

// check asserts once per slot and no overlap: every slot all n nodes saw
// ran exactly once, with n-1 skips, the slots follow each other every
// interval, and no two executions overlapped.
func (j *journal) check(t *testing.T, n int, interval time.Duration) {
	t.Helper()
	slots := j.slotsSeenByAll(n)
	j.mu.Lock()
	defer j.mu.Unlock()
	ran := map[time.Time]int{}
	for _, e := range j.execs {
		ran[e.slot.UTC()]++
	}
	for s, c := range ran {
		if c > 1 {
			t.Errorf("slot %v ran %d times", s, c)
		}
	}
	outcomes := map[time.Time]map[scheduler.Outcome]int{}
	for _, r := range j.records {
		s := r.Slot.UTC()
		if outcomes[s] == nil {
			outcomes[s] = map[scheduler.Outcome]int{}
		}
		outcomes[s][r.Outcome]++
		if r.Outcome != scheduler.Ran && r.Outcome != scheduler.Skipped {
			t.Errorf("slot %v on %s: outcome %s (%s, %v)", s, r.Instance, r.Outcome, r.Reason, r.Err)
		}
	}
	for i, s := range slots {
		if ran[s] != 1 || outcomes[s][scheduler.Ran] != 1 || outcomes[s][scheduler.Skipped] != n-1 {
			t.Errorf("slot %v: %d executions, outcomes %v; want 1 run and %d skips", s, ran[s], outcomes[s], n-1)
		}
		if i > 0 && s.Sub(slots[i-1]) != interval {
			t.Errorf("slot %v follows %v: a slot is missing", s, slots[i-1])
		}
		if s.Truncate(interval) != s {
			t.Errorf("slot %v is not aligned to %v", s, interval)
		}
	}
	execs := slices.Clone(j.execs)
	slices.SortFunc(execs, func(a, b execution) int { return a.start.Compare(b.start) })
	for i := 1; i < len(execs); i++ {
		if execs[i].start.Before(execs[i-1].end) {
			t.Errorf("run of slot %v on %s started before the run of slot %v on %s ended",
				execs[i].slot, execs[i].instance, execs[i-1].slot, execs[i-1].instance)
		}
	}
	t.Logf("%d slots, each run once by one of %d schedulers", len(slots), n)
}

func newScheduler(t *testing.T, g *guard.Guard, opts ...scheduler.Option) *scheduler.Scheduler {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	s, err := scheduler.New(g, append([]scheduler.Option{scheduler.WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func stop(t *testing.T, s *scheduler.Scheduler) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

const wantSlots = 10

// TestThreeSchedulersOncePerSlot: three schedulers on "@every 1s" for ten
// seconds run each slot exactly once and never overlap.
func TestThreeSchedulersOncePerSlot(t *testing.T) {
	t.Parallel()
	eachBackend(t, nil, func(t *testing.T, b backend) {
		c := b.setup(t)
		var j journal
		name := uniqueName("every")
		var nodes []*scheduler.Scheduler
		for _, inst := range []string{"a", "b", "c"} {
			s := newScheduler(t, c.node(t), scheduler.WithInstance(inst), scheduler.WithSlotStore(c.store), scheduler.WithRunObserver(j.observe))
			if err := s.Add("@every 1s", name, j.job(50*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			nodes = append(nodes, s)
		}
		for _, s := range nodes {
			s.Start()
		}
		waitFor(t, "ten slots", 30*time.Second, func() bool { return len(j.slotsSeenByAll(3)) >= wantSlots })
		for _, s := range nodes {
			stop(t, s)
		}
		j.check(t, 3, time.Second)
	})
}

// TestClockOffsetOncePerSlot: one scheduler starts 400 ms after the others
// with its clock 400 ms ahead, so its timer fires 400 ms before theirs; a
// 50 ms job still runs once per slot.
func TestClockOffsetOncePerSlot(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(backend) bool { return true }, func(t *testing.T, b backend) {
		c := b.setup(t)
		var j journal
		name := uniqueName("skew")
		add := func(inst string, opts ...scheduler.Option) *scheduler.Scheduler {
			s := newScheduler(t, c.node(t), append(opts, scheduler.WithInstance(inst),
				scheduler.WithSlotStore(c.store), scheduler.WithRunObserver(j.observe))...)
			if err := s.Add("@every 1s", name, j.job(50*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			return s
		}
		a, b2 := add("a"), add("b")
		skewed := add("skewed", scheduler.WithClock(func() time.Time { return time.Now().Add(400 * time.Millisecond) }))
		a.Start()
		b2.Start()
		// The late start is the scenario, not a wait for an outcome.
		time.Sleep(400 * time.Millisecond)
		skewed.Start()
		waitFor(t, "ten slots", 30*time.Second, func() bool { return len(j.slotsSeenByAll(3)) >= wantSlots })
		for _, s := range []*scheduler.Scheduler{a, b2, skewed} {
			stop(t, s)
		}
		j.check(t, 3, time.Second)
	})
}

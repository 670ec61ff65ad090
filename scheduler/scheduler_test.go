package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
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
	// released is when the run's lock context ended (real time): the
	// release had been answered by then.
	released time.Time
}

// journal collects what the nodes of one test did.
type journal struct {
	mu      sync.Mutex
	execs   []*execution
	records []scheduler.RunRecord
	// offsets is how far each instance's clock is ahead of real time; the
	// records are on those clocks.
	offsets map[string]time.Duration
	// releases counts the runs whose lock release is yet to be seen.
	releases sync.WaitGroup
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
		e := &execution{slot: run.Slot, instance: run.Instance, start: time.Now()}
		j.mu.Lock()
		j.execs = append(j.execs, e)
		j.mu.Unlock()
		j.releases.Add(1)
		context.AfterFunc(run.Lock.Context(), func() {
			j.mu.Lock()
			e.released = time.Now()
			j.mu.Unlock()
			j.releases.Done()
		})
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		j.mu.Lock()
		e.end = time.Now()
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

// check asserts once per slot and no overlap, after the nodes have
// stopped: no slot ran twice and no two executions overlapped; and every
// slot from the first to the last of seen (slots all n nodes had an
// outcome for before Stop was called at stopped) ran once, the other nodes
// skipping it, unless a run of another slot still held the job's lock, an
// overrun the scheduler skips by design. A node may have no outcome for a
// slot: robfig/cron drops a firing when its timer loop runs an interval
// late, which a starved machine does (the node records it as never
// fired); some node must have one. A slot
// between them that some node had not finished with by then is left out
// if Stop cut a node's run of it short.
func (j *journal) check(t *testing.T, seen []time.Time, stopped time.Time, n int, interval time.Duration) {
	t.Helper()
	if len(seen) == 0 {
		t.Fatal("no slot to check")
	}
	// Stop has returned, so every lock is released; the AfterFuncs that
	// note it run in goroutines of their own.
	released := make(chan struct{})
	go func() {
		j.releases.Wait()
		close(released)
	}()
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("a run's lock context did not end after Stop")
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	ran := map[time.Time]*execution{}
	for _, e := range j.execs {
		if ran[e.slot.UTC()] != nil {
			t.Errorf("slot %v ran twice, on %s and %s", e.slot, ran[e.slot.UTC()].instance, e.instance)
		}
		ran[e.slot.UTC()] = e
	}
	first, last := seen[0], seen[len(seen)-1]
	bySlot := map[time.Time][]scheduler.RunRecord{}
	for _, r := range j.records {
		s := r.Slot.UTC()
		if s.Truncate(interval) != s {
			t.Errorf("slot %v on %s is not aligned to %v", s, r.Instance, interval)
		}
		if r.Outcome == scheduler.Misfired && strings.HasPrefix(r.Reason, "never fired") {
			// The node's timer ran late: it had no outcome of its own
			// for the slot, which it says so.
			t.Logf("slot %v on %s: %s", s, r.Instance, r.Reason)
			continue
		}
		bySlot[s] = append(bySlot[s], r)
	}
	checked, once, overruns := 0, 0, 0
	for s := first; !s.After(last); s = s.Add(interval) {
		recs := bySlot[s]
		if slices.ContainsFunc(recs, func(r scheduler.RunRecord) bool { return j.real(r, r.Finished).After(stopped) }) {
			t.Logf("slot %v left out: a node's run of it ended after Stop", s)
			continue
		}
		checked++
		outcomes := map[scheduler.Outcome]int{}
		for _, r := range recs {
			outcomes[r.Outcome]++
			if r.Outcome != scheduler.Ran && r.Outcome != scheduler.Skipped {
				t.Errorf("slot %v on %s: outcome %s (%s, %v)", s, r.Instance, r.Outcome, r.Reason, r.Err)
			}
			if r.Reason == "lock held" && !j.heldElsewhere(r) {
				t.Errorf("slot %v: %s found the lock held while no run held it%s", s, r.Instance, j.describe(s, interval))
			}
		}
		if len(recs) < n {
			t.Logf("slot %v: outcomes from %d of %d nodes%s", s, len(recs), n, j.describe(s, interval))
		}
		switch {
		case len(recs) == 0 || len(recs) > n:
			t.Errorf("slot %v: outcomes from %d of %d nodes", s, len(recs), n)
		case ran[s] != nil && outcomes[scheduler.Ran] == 1 && outcomes[scheduler.Skipped] == len(recs)-1:
			once++
		case ran[s] == nil && outcomes[scheduler.Skipped] == len(recs) && j.overrun(s):
			overruns++
		default:
			t.Errorf("slot %v: executed %t, outcomes %v from %d nodes; want 1 run and the rest skips, or all skips of an overrun%s",
				s, ran[s] != nil, outcomes, len(recs), j.describe(s, interval))
		}
	}
	execs := slices.Clone(j.execs)
	slices.SortFunc(execs, func(a, b *execution) int { return a.start.Compare(b.start) })
	for i := 1; i < len(execs); i++ {
		if execs[i].start.Before(execs[i-1].end) {
			t.Errorf("run of slot %v on %s started before the run of slot %v on %s ended",
				execs[i].slot, execs[i].instance, execs[i-1].slot, execs[i-1].instance)
		}
	}
	t.Logf("%d slots checked, %d run once by one of %d schedulers, %d skipped by all while an earlier run held the lock",
		checked, once, n, overruns)
}

// overrun reports whether slot s, which every node skipped, was skipped
// because a run of another slot held the job's lock: a node that claimed
// the slot found the lock held while another run held it, and every other
// node skipped the slot as claimed by such a node or found the lock held
// too. Called with j.mu held.
func (j *journal) overrun(s time.Time) bool {
	blocked := map[string]bool{}
	for _, r := range j.records {
		if r.Slot.UTC().Equal(s) && r.Reason == "lock held" && j.heldElsewhere(r) {
			blocked[r.Instance] = true
		}
	}
	for _, r := range j.records {
		if !r.Slot.UTC().Equal(s) || r.Reason == "lock held" {
			continue
		}
		if holder, ok := strings.CutPrefix(r.Reason, "slot in_progress by "); !ok || !blocked[holder] {
			return false
		}
	}
	return len(blocked) > 0
}

// heldElsewhere reports whether a run of another slot held the lock at
// some moment of r's attempt: it began (before its lock was taken) before r
// ended, and its lock was released after r began. Called with j.mu held.
func (j *journal) heldElsewhere(r scheduler.RunRecord) bool {
	from, to := j.real(r, r.Started), j.real(r, r.Finished)
	for _, h := range j.records {
		if h.Outcome != scheduler.Ran || h.Slot.Equal(r.Slot) {
			continue
		}
		for _, e := range j.execs {
			if e.slot.Equal(h.Slot) && j.real(h, h.Started).Before(to) && e.released.After(from) {
				return true
			}
		}
	}
	return false
}

// real turns a time of r's, on its scheduler's clock, into real time.
func (j *journal) real(r scheduler.RunRecord, at time.Time) time.Time {
	return at.Add(-j.offsets[r.Instance])
}

// describe lists what each node did for slot s and the slot before it, in
// real time, for a failure's message. Called with j.mu held.
func (j *journal) describe(s time.Time, interval time.Duration) string {
	var b strings.Builder
	for _, r := range j.records {
		if r.Slot.UTC().Equal(s) || r.Slot.UTC().Equal(s.Add(-interval)) {
			fmt.Fprintf(&b, "\n\tslot %s on %s: %s %q, from %s to %s", r.Slot.UTC().Format(time.TimeOnly), r.Instance, r.Outcome, r.Reason,
				j.real(r, r.Started).UTC().Format("15:04:05.000"), j.real(r, r.Finished).UTC().Format("15:04:05.000"))
		}
	}
	for _, e := range j.execs {
		if e.slot.UTC().Equal(s) || e.slot.UTC().Equal(s.Add(-interval)) {
			fmt.Fprintf(&b, "\n\tslot %s ran on %s from %s to %s, lock released by %s", e.slot.UTC().Format(time.TimeOnly), e.instance,
				e.start.UTC().Format("15:04:05.000"), e.end.UTC().Format("15:04:05.000"), e.released.UTC().Format("15:04:05.000"))
		}
	}
	return b.String()
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
// seconds run each slot exactly once and never overlap. On a loaded
// machine a run can still hold the lock when the next slot falls due (its
// claim, lock, job, completion and release took over a second at load 16);
// that slot is skipped, as the scheduler documents, and check verifies it.
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
		seen, stopped := j.slotsSeenByAll(3), time.Now()
		for _, s := range nodes {
			stop(t, s)
		}
		j.check(t, seen, stopped, 3, time.Second)
	})
}

// TestClockOffsetOncePerSlot: one scheduler starts 400 ms after the others
// with its clock 400 ms ahead, so its timer fires 400 ms before theirs; a
// 50 ms job still runs once per slot (save overruns, as above).
func TestClockOffsetOncePerSlot(t *testing.T) {
	t.Parallel()
	const skew = 400 * time.Millisecond
	eachBackend(t, func(backend) bool { return true }, func(t *testing.T, b backend) {
		c := b.setup(t)
		j := journal{offsets: map[string]time.Duration{"skewed": skew}}
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
		skewed := add("skewed", scheduler.WithClock(func() time.Time { return time.Now().Add(skew) }))
		a.Start()
		b2.Start()
		// The late start is the scenario, not a wait for an outcome.
		time.Sleep(skew)
		skewed.Start()
		waitFor(t, "ten slots", 30*time.Second, func() bool { return len(j.slotsSeenByAll(3)) >= wantSlots })
		seen, stopped := j.slotsSeenByAll(3), time.Now()
		for _, s := range []*scheduler.Scheduler{a, b2, skewed} {
			stop(t, s)
		}
		j.check(t, seen, stopped, 3, time.Second)
	})
}

package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

// The scheduler's timing in synctest bubbles: robfig/cron's timer, the
// lease keeper, the slot store and the lock all run on fake time, so each
// test states what happens at each instant, and holds however loaded the
// machine is.

// outcomes is what a RunObserver saw, by slot.
type outcomes struct {
	mu   sync.Mutex
	recs []scheduler.RunRecord
}

func (o *outcomes) observe(r scheduler.RunRecord) {
	o.mu.Lock()
	o.recs = append(o.recs, r)
	o.mu.Unlock()
}

func (o *outcomes) all() []scheduler.RunRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]scheduler.RunRecord(nil), o.recs...)
}

// summary is "slot+offset outcome" for each record, in order, the slot
// given as seconds after base.
func (o *outcomes) summary(base time.Time) []string {
	var out []string
	for _, r := range o.all() {
		out = append(out, fmt.Sprintf("%v %s", r.Slot.Sub(base), r.Outcome))
	}
	return out
}

// bubbleScheduler is a started scheduler inside the bubble, stopped when
// the bubble's test ends.
func bubbleScheduler(t *testing.T, g *guard.Guard, instance string, o *outcomes, opts ...scheduler.Option) *scheduler.Scheduler {
	t.Helper()
	s := newScheduler(t, g, append([]scheduler.Option{scheduler.WithInstance(instance), scheduler.WithRunObserver(o.observe)}, opts...)...)
	t.Cleanup(func() { stop(t, s) })
	return s
}

// Three schedulers sharing a lock backend and a slot store run each slot of
// "@every 1s" exactly once, at its slot to the instant, every slot a whole
// second after the anchor.
func TestSlotsOncePerSlotOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var o outcomes
		var mu sync.Mutex
		runs := map[time.Time]int{}
		for i := range 3 {
			s := bubbleScheduler(t, newGuard(t, locker), fmt.Sprint("node-", i), &o, scheduler.WithSlotStore(store))
			err := s.Add("@every 1s", "tick", func(ctx context.Context) error {
				run, _ := scheduler.RunFrom(ctx)
				if now := time.Now(); !now.Equal(run.Slot) {
					t.Errorf("slot %v ran at %v", run.Slot, now)
				}
				mu.Lock()
				runs[run.Slot]++
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
		}
		start := time.Now()
		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(runs) != 10 {
			t.Errorf("%d slots ran in 10s, want 10: %v", len(runs), runs)
		}
		for slot, n := range runs {
			if n != 1 {
				t.Errorf("slot %v ran %d times", slot, n)
			}
			if slot.Sub(start)%time.Second != 0 || slot.UnixNano()%int64(time.Second) != 0 {
				t.Errorf("slot %v is not a whole second after the anchor", slot)
			}
		}
	})
}

// A run that waits for its lock past MisfireAfter misfires, and says by
// how much; the next slot runs.
func TestMisfireWhenTheLockComesLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		var o outcomes
		s := bubbleScheduler(t, g, "solo", &o)
		var ran atomic.Int32
		err := s.Add("@every 2s", "late", func(context.Context) error { ran.Add(1); return nil },
			scheduler.WaitForLock(5*time.Second), scheduler.MisfireAfter(300*time.Millisecond),
			scheduler.LockAtLeastFor(0))
		if err != nil {
			t.Fatal(err)
		}
		// Held from before the first slot until 500ms past it.
		first := time.Now().Truncate(2 * time.Second).Add(2 * time.Second)
		held, err := g.TryLock(context.Background(), "late")
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		time.Sleep(time.Until(first) + 500*time.Millisecond)
		held.Unlock(context.Background())
		time.Sleep(2 * time.Second)
		synctest.Wait()
		recs := o.all()
		if len(recs) < 2 {
			t.Fatalf("records %v, want a misfire then a run", o.summary(first))
		}
		if recs[0].Outcome != scheduler.Misfired || recs[0].Reason != "lock taken 500ms after its slot" {
			t.Errorf("first slot: %s %q, want misfired, lock taken 500ms after its slot", recs[0].Outcome, recs[0].Reason)
		}
		if recs[1].Outcome != scheduler.Ran || !recs[1].Slot.Equal(first.Add(2*time.Second)) || ran.Load() != 1 {
			t.Errorf("then %v, %d runs; want the next slot to run", o.summary(first), ran.Load())
		}
	})
}

// A run that overruns its interval keeps the lock: the slots that fall due
// meanwhile are skipped ("lock held"), the next after it runs; and
// LockAtMostFor cancels a run at its cap to the instant.
func TestOverrunsSkipAndTheCapCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		var o outcomes
		s := bubbleScheduler(t, g, "solo", &o)
		var ended atomic.Int64
		err := s.Add("@every 1s", "long", func(ctx context.Context) error {
			run, _ := scheduler.RunFrom(ctx)
			select {
			case <-time.After(2500 * time.Millisecond):
			case <-ctx.Done():
				ended.Store(int64(time.Since(run.Slot)))
				return context.Cause(ctx)
			}
			return nil
		}, scheduler.LockAtMostFor(5*time.Second), scheduler.LockAtLeastFor(0))
		if err != nil {
			t.Fatal(err)
		}
		base := time.Now().Truncate(time.Second).Add(time.Second)
		s.Start()
		time.Sleep(time.Until(base) + 3500*time.Millisecond)
		synctest.Wait()
		want := []string{"1s skipped", "2s skipped", "0s ran", "3s ran"}
		got := o.summary(base)
		// The run of slot 3s has started but not ended: no record yet.
		if fmt.Sprint(got) != fmt.Sprint(want[:3]) {
			t.Errorf("records %v, want %v", got, want[:3])
		}
		for _, r := range o.all() {
			if r.Outcome == scheduler.Skipped && r.Reason != "lock held" {
				t.Errorf("skip of %v: %q, want lock held", r.Slot.Sub(base), r.Reason)
			}
		}
		if d := time.Duration(ended.Load()); d != 0 {
			t.Errorf("a 2.5s run under a 5s cap was cancelled after %v", d)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		var o outcomes
		s := bubbleScheduler(t, g, "solo", &o)
		cancelled := make(chan time.Duration, 1)
		err := s.Add("@every 10s", "capped", func(ctx context.Context) error {
			run, _ := scheduler.RunFrom(ctx)
			<-ctx.Done()
			cancelled <- time.Since(run.Slot)
			return context.Cause(ctx)
		}, scheduler.LockAtMostFor(1500*time.Millisecond), scheduler.LockAtLeastFor(0))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		if d := <-cancelled; d != 1500*time.Millisecond {
			t.Errorf("cancelled %v after its slot, want at its 1.5s cap", d)
		}
	})
}

// A slot whose runner died mid-run (its claim no longer renewed) is caught
// up by another node once the claim has lapsed, within the slot's misfire
// window.
func TestCatchUpOnceTheDeadClaimLapses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		g := newGuard(t, locker, guard.WithTTL(2*time.Second))
		var o outcomes
		s := bubbleScheduler(t, g, "survivor", &o, scheduler.WithSlotStore(store))
		ranAt := make(chan time.Time, 1)
		err := s.Add("@every 1m", "report", func(ctx context.Context) error {
			ranAt <- time.Now()
			return nil
		}, scheduler.CatchUp(), scheduler.MisfireAfter(20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		slot := time.Now().Truncate(time.Minute).Add(time.Minute)
		s.Start()
		time.Sleep(time.Until(slot) - time.Millisecond)
		// The dead runner claimed the slot just before its instant (its
		// clock a little ahead) and then stopped: its claim's 2s lease is
		// never renewed.
		rec, err := store.Claim(context.Background(), idempotency.Claim{Scope: "warden.scheduler",
			Key: "report@" + slot.UTC().Format(time.RFC3339Nano), Owner: "dead:0", Lease: 2 * time.Second})
		if err != nil || rec != nil {
			t.Fatalf("the dead runner's claim: %v %v", rec, err)
		}
		select {
		case at := <-ranAt:
			// Polled every half lease: the claim lapsed at 2s, seen at 2s.
			if lag := at.Sub(slot); lag < 2*time.Second || lag > 3*time.Second {
				t.Errorf("caught up %v after the slot, want once the 2s claim lapsed", lag)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the slot was not caught up within its misfire window: %v", o.summary(slot))
		}
	})
}

// Three schedulers, one with its clock 400ms ahead and so firing 400ms
// before the others, run each slot of "@every 1s" exactly once, on the
// early node at its instant, although each run lasts 950ms: a run's lock is
// released when the run ends, in time for the next slot 50ms later, and
// the late nodes find the slot taken. This is what the wall-clock
// TestClockOffsetOncePerSlot shows on real backends, without its overruns.
func TestOffsetClockLongRunsOncePerSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const skew, work = 400 * time.Millisecond, 950 * time.Millisecond
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var o outcomes
		var mu sync.Mutex
		runs := map[time.Time][]string{}
		for _, inst := range []string{"a", "b", "ahead"} {
			opts := []scheduler.Option{scheduler.WithSlotStore(store)}
			if inst == "ahead" {
				opts = append(opts, scheduler.WithClock(func() time.Time { return time.Now().Add(skew) }))
			}
			s := bubbleScheduler(t, newGuard(t, locker), inst, &o, opts...)
			err := s.Add("@every 1s", "tick", func(ctx context.Context) error {
				run, _ := scheduler.RunFrom(ctx)
				if at := time.Now(); !at.Equal(run.Slot.Add(-skew)) {
					t.Errorf("slot %v ran on %s at %v, want when the early clock showed it", run.Slot, run.Instance, at)
				}
				mu.Lock()
				runs[run.Slot] = append(runs[run.Slot], run.Instance)
				mu.Unlock()
				time.Sleep(work)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
		}
		base := time.Now().Truncate(time.Second).Add(time.Second)
		time.Sleep(time.Until(base) + 10*time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		for i := range 10 {
			slot := base.Add(time.Duration(i) * time.Second)
			if got := runs[slot]; len(got) != 1 || got[0] != "ahead" {
				t.Errorf("slot %v ran on %v, want once, on the early node", slot.Sub(base), got)
			}
		}
		for _, r := range o.all() {
			if r.Instance != "ahead" && (r.Outcome != scheduler.Skipped || r.Reason != "slot in_progress by ahead") {
				t.Errorf("slot %v on %s: %s %q, want skipped as in progress on the early node", r.Slot.Sub(base), r.Instance, r.Outcome, r.Reason)
			}
		}
	})
}

// A clock stepped 3s forward between two firings of "@every 1s" (as a late
// timer loop does to the slots it fires after): the slots it steps over
// were never fired, and are recorded as one misfired outcome under the
// first of them, not dropped; every slot before and after runs once.
func TestSlotsNeverFiredAreRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var step atomic.Int64
		clock := func() time.Time { return time.Now().Add(time.Duration(step.Load())) }
		var o outcomes
		s := bubbleScheduler(t, newGuard(t, memory.New()), "a", &o, scheduler.WithClock(clock))
		if err := s.Add("@every 1s", "tick", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		base := time.Now()
		s.Start()
		time.Sleep(2500 * time.Millisecond)
		step.Store(int64(3 * time.Second))
		time.Sleep(3 * time.Second)
		synctest.Wait()
		stop(t, s)
		// By slot: the misfire is recorded on a goroutine of its own,
		// alongside the run of the slot fired just before it.
		want := []string{"1s ran", "2s ran", "3s ran", "4s misfired", "7s ran", "8s ran"}
		got := o.summary(base)
		slices.Sort(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("outcomes %v, want %v", got, want)
		}
		for _, r := range o.all() {
			if r.Outcome == scheduler.Misfired && r.Reason != "never fired, nor the 2 slots after it up to "+base.Add(6*time.Second).String()+": the timer ran late" {
				t.Errorf("misfired %v: reason %q", r.Slot.Sub(base), r.Reason)
			}
		}
	})
}

// lostAnswerStore is a slot store whose Claim answers never come back: each
// call waits for its ctx, as a call cut off by Stop does, after reaching the
// store (land) or not.
type lostAnswerStore struct {
	*idempotency.MemoryStore
	land    bool
	claimed chan struct{}
}

func (s *lostAnswerStore) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if s.land {
		if rec, err := s.MemoryStore.Claim(ctx, c); rec != nil || err != nil {
			return rec, err
		}
	}
	s.claimed <- struct{}{}
	<-ctx.Done()
	return nil, context.Cause(ctx)
}

// A run that Stop cuts off while its slot claim is on its way gives the
// claim back if it landed, rather than leave the slot in progress for
// every node until the claim lapses (over an hour here); a claim that
// did not land frees nobody else's.
func TestStopMidClaimGivesTheClaimBack(t *testing.T) {
	for _, land := range []bool{true, false} {
		t.Run(fmt.Sprint("landed=", land), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				store := &lostAnswerStore{MemoryStore: idempotency.NewMemoryStore(), land: land, claimed: make(chan struct{}, 1)}
				var o outcomes
				s := newScheduler(t, newGuard(t, memory.New()), scheduler.WithInstance("node"),
					scheduler.WithRunObserver(o.observe), scheduler.WithSlotStore(store))
				err := s.Add("@every 1m", "report", func(context.Context) error {
					t.Error("the job ran without its claim")
					return nil
				}, scheduler.LockAtMostFor(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				slot := time.Now().Truncate(time.Minute).Add(time.Minute)
				key := "report@" + slot.UTC().Format(time.RFC3339Nano)
				if !land {
					rec, err := store.MemoryStore.Claim(ctx, idempotency.Claim{Scope: "warden.scheduler", Key: key, Owner: "other:0", Lease: time.Hour})
					if err != nil || rec != nil {
						t.Fatalf("the other node's claim: %v %v", rec, err)
					}
				}
				s.Start()
				<-store.claimed
				stop(t, s)
				rec, err := store.Get(ctx, "warden.scheduler", key)
				switch {
				case land && !errors.Is(err, idempotency.ErrNotFound):
					t.Errorf("the landed claim was not given back: %+v %v", rec, err)
				case !land && (err != nil || rec.Owner != "other:0" || rec.State != idempotency.StateInProgress):
					t.Errorf("the other node's claim was touched: %+v %v", rec, err)
				}
				if got := o.summary(slot); !slices.Equal(got, []string{"0s failed"}) {
					t.Errorf("outcomes %v, want the slot failed", got)
				}
			})
		})
	}
}

// resentClaims sends each slot claim twice, answering the second: what
// go-redis does with a command whose answer did not come within its read
// timeout.
type resentClaims struct{ *idempotency.MemoryStore }

func (s resentClaims) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if _, err := s.MemoryStore.Claim(ctx, c); err != nil {
		return nil, err
	}
	return s.MemoryStore.Claim(ctx, c)
}

// A slot claim sent again finds the claim its first sending made, under its
// own owner, and runs the slot, instead of skipping it as claimed by itself
// and leaving it claimed, run by nobody, until the claim lapses.
func TestResentSlotClaimRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := resentClaims{idempotency.NewMemoryStore()}
		var o outcomes
		s := bubbleScheduler(t, newGuard(t, memory.New()), "node", &o, scheduler.WithSlotStore(store))
		if err := s.Add("@every 1m", "report", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		slot := time.Now().Truncate(time.Minute).Add(time.Minute)
		s.Start()
		time.Sleep(time.Until(slot) + time.Second)
		synctest.Wait()
		if got := o.summary(slot); !slices.Equal(got, []string{"0s ran"}) {
			t.Errorf("outcomes %v, want the slot run", got)
		}
	})
}

// stalledStore answers its first Claim, or holds its first Extend (a
// renewal), pause after the call lands: the process was paused (SIGSTOP,
// a VM or GC pause) between the call and reading its answer.
type stalledStore struct {
	idempotency.Store
	method string // "Claim" or "Extend"
	pause  time.Duration
	done   atomic.Bool
}

func (p *stalledStore) stall(method string) {
	if method == p.method && p.done.CompareAndSwap(false, true) {
		time.Sleep(p.pause)
	}
}

func (p *stalledStore) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	rec, err := p.Store.Claim(ctx, c)
	p.stall("Claim")
	return rec, err
}

func (p *stalledStore) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	err := p.Store.Extend(ctx, scope, key, owner, lease)
	p.stall("Extend")
	return err
}

// A CatchUp slot runs once when its first claimant stalls past its claim's
// lease before taking the job's lock, and another node catches the lapsed
// slot up meanwhile: "Claim", the claim's answer comes 8 s late (its lease
// is 2 s) and is given back, not acted on; "Extend", the claimant's
// renewals stall while it waits for the lock, held elsewhere until 6 s
// after the slot, and the claimant, having the lock at last, finds its
// claim gone and skips, whichever of the two nodes gets the lock first.
func TestStalledClaimantDoesNotRunACaughtUpSlot(t *testing.T) {
	for _, method := range []string{"Claim", "Extend"} {
		t.Run(method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				locker, store := memory.New(), idempotency.NewMemoryStore()
				slot := time.Now().Add(2 * time.Second).Truncate(time.Second)
				if method == "Extend" {
					holder, err := newGuard(t, locker, guard.WithTTL(time.Second)).Lock(context.Background(), "report")
					if err != nil {
						t.Fatal(err)
					}
					time.AfterFunc(time.Until(slot)+6*time.Second, func() { holder.Unlock(context.Background()) })
				}
				var o outcomes
				var ran atomic.Int32
				opts := []scheduler.JobOption{scheduler.CatchUp(), scheduler.MisfireAfter(30 * time.Second), scheduler.WaitForLock(20 * time.Second)}
				for _, n := range []struct {
					name  string
					store idempotency.Store
					skew  time.Duration
				}{
					{"A", &stalledStore{Store: store, method: method, pause: 8 * time.Second}, 0},
					// B's clock is behind: A claims first.
					{"B", store, -300 * time.Millisecond},
				} {
					s := bubbleScheduler(t, newGuard(t, locker, guard.WithTTL(time.Second)), n.name, &o, scheduler.WithSlotStore(n.store),
						scheduler.WithAnchor(slot), scheduler.WithClock(func() time.Time { return time.Now().Add(n.skew) }))
					if err := s.Add("@every 1h", "report", func(context.Context) error {
						ran.Add(1)
						time.Sleep(100 * time.Millisecond)
						return nil
					}, opts...); err != nil {
						t.Fatal(err)
					}
					s.Start()
				}
				time.Sleep(time.Until(slot) + 20*time.Second)
				synctest.Wait()
				if n := ran.Load(); n != 1 {
					t.Errorf("the slot ran %d times, want once; outcomes %v", n, o.summary(slot))
				}
				rec, err := store.Get(context.Background(), "warden.scheduler", "report@"+slot.UTC().Format(time.RFC3339Nano))
				if err != nil || rec.State != idempotency.StateCompleted {
					t.Errorf("slot record %+v, %v; want it completed", rec, err)
				}
			})
		})
	}
}

// Two replicas sharing a slot store run a daily job once on the days the
// clocks change: in the repeated hour once, and at a time the clocks skip
// at the change (see TestDSTSlotsKeepCronsRule for the slots).
func TestDailyJobOnceOnDSTDays(t *testing.T) {
	for _, c := range []struct {
		zone, spec, day, want string // want: the slot, UTC
	}{
		{"America/New_York", "30 1 * * *", "2026-11-01", "05:30"},
		{"America/New_York", "30 2 * * *", "2026-03-08", "07:00"},
		{"Europe/London", "30 1 * * *", "2026-10-25", "00:30"},
		{"Europe/London", "30 1 * * *", "2026-03-29", "01:00"},
	} {
		t.Run(c.zone+" "+c.day, func(t *testing.T) {
			loc, err := time.LoadLocation(c.zone)
			if err != nil {
				t.Fatal(err)
			}
			from, err := time.ParseInLocation(time.DateOnly, c.day, loc)
			if err != nil {
				t.Fatal(err)
			}
			synctest.Test(t, func(t *testing.T) {
				offset := time.Until(from)
				clock := func() time.Time { return time.Now().Add(offset) }
				locker, store := memory.New(), idempotency.NewMemoryStore()
				var mu sync.Mutex
				var slots []string
				var o outcomes
				for _, inst := range []string{"r1", "r2"} {
					s := bubbleScheduler(t, newGuard(t, locker), inst, &o, scheduler.WithSlotStore(store),
						scheduler.WithLocation(loc), scheduler.WithClock(clock))
					if err := s.Add(c.spec, "daily", func(ctx context.Context) error {
						r, _ := scheduler.RunFrom(ctx)
						mu.Lock()
						slots = append(slots, r.Slot.UTC().Format("15:04"))
						mu.Unlock()
						return nil
					}); err != nil {
						t.Fatal(err)
					}
					s.Start()
				}
				time.Sleep(23 * time.Hour)
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				if !slices.Equal(slots, []string{c.want}) {
					t.Errorf("%q ran at %v UTC on %s, want once at %s", c.spec, slots, c.day, c.want)
				}
			})
		})
	}
}

// A run cut short by Stop (a rolling deploy at the slot's time) has not
// finished its slot: with CatchUp its claim is given back, and the node
// watching it runs the slot, as it would a dead runner's. It was recorded
// as failed and done, and never run.
func TestCatchUpRunsASlotStopCutShort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var o outcomes
		ahead := func() time.Time { return time.Now().Add(100 * time.Millisecond) }
		a := bubbleScheduler(t, newGuard(t, locker, guard.WithTTL(2*time.Second)), "a", &o, scheduler.WithSlotStore(store), scheduler.WithClock(ahead))
		b := bubbleScheduler(t, newGuard(t, locker, guard.WithTTL(2*time.Second)), "b", &o, scheduler.WithSlotStore(store))
		ranOnB := make(chan time.Time, 1)
		started := make(chan struct{}, 1)
		for _, s := range []*scheduler.Scheduler{a, b} {
			err := s.Add("@every 1m", "report", func(ctx context.Context) error {
				run, _ := scheduler.RunFrom(ctx)
				if run.Instance == "a" {
					started <- struct{}{}
					<-ctx.Done()
					return context.Cause(ctx)
				}
				ranOnB <- run.Slot
				return nil
			}, scheduler.CatchUp(), scheduler.MisfireAfter(30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
		}
		<-started
		slot := time.Now().Truncate(time.Minute).Add(time.Minute)
		time.Sleep(5 * time.Second)
		a.Stop(context.Background())
		select {
		case s := <-ranOnB:
			if !s.Equal(slot) {
				t.Errorf("caught up slot %v, want %v", s, slot)
			}
		case <-time.After(40 * time.Second):
			t.Errorf("the slot was not caught up: %v", o.summary(slot))
		}
	})
}

// A node's clock stepped 45s back while it runs a minute's slot (an NTP
// correction, here through WithClock): the node runs no slot twice. It
// named the slot it had just fired again once its clock showed a time
// before it, and ran it a second time 45s later: without a slot store
// nothing else stands between a node and its own slot.
func TestClockSteppedBackRunsNoSlotTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var step atomic.Int64
		clock := func() time.Time { return time.Now().Add(time.Duration(step.Load())) }
		var o outcomes
		s := bubbleScheduler(t, newGuard(t, memory.New()), "a", &o, scheduler.WithClock(clock))
		stepped := make(chan struct{})
		var runs atomic.Int32
		err := s.Add("0 * * * * *", "minutely", func(ctx context.Context) error {
			if runs.Add(1) == 2 {
				step.Store(int64(-45 * time.Second))
				close(stepped)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		base := time.Now()
		s.Start()
		<-stepped
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		// The step comes during the run of 2m, after the timer was set for
		// 3m, which fires on time (its clock showing 2m15s); 4m fires when
		// the stepped clock shows it, 45s late.
		want := []string{"1m0s ran", "2m0s ran", "3m0s ran", "4m0s ran"}
		if got := o.summary(base); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("outcomes %v, want %v", got, want)
		}
	})
}

// A node whose clock is a whole number of intervals ahead (10 minutes, on a
// minutely job) runs a later slot at the instant another node runs an
// earlier one that the fast node gave back, having found the lock held by a
// run of a still earlier slot. The two runs meet at the job's lock, and
// when the fast node's comes first the other's slot is skipped on the last
// node to fire it: it runs nowhere, recorded skipped ("lock held") on
// every node.
func TestClockAheadByIntervalsLeavesNoSlotUnrun(t *testing.T) {
	t.Skip("defect: a node ahead by whole intervals leaves slots unrun, 3 to 10 of the first 30 here in 60 tries (the package documentation says so; WaitForLock avoids it)")
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var o outcomes
		var m minuteRuns
		for _, inst := range []string{"a", "b", "ahead"} {
			opts := []scheduler.Option{scheduler.WithSlotStore(store)}
			if inst == "ahead" {
				opts = append(opts, scheduler.WithClock(func() time.Time { return time.Now().Add(10 * time.Minute) }))
			}
			s := bubbleScheduler(t, newGuard(t, locker), inst, &o, opts...)
			err := s.Add("0 * * * * *", "minutely", func(ctx context.Context) error {
				time.Sleep(10 * time.Millisecond)
				return m.job(ctx)
			})
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
		}
		base := time.Now()
		time.Sleep(31 * time.Minute)
		synctest.Wait()
		if unrun := m.unrun(base, 30); len(unrun) > 0 {
			t.Errorf("of the first 30 slots, %v ran nowhere", unrun)
		}
	})
}

// minuteRuns counts the runs of each slot of a minutely job.
type minuteRuns struct {
	mu  sync.Mutex
	ran map[time.Time]int
}

// job records its run's slot.
func (m *minuteRuns) job(ctx context.Context) error {
	run, _ := scheduler.RunFrom(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ran == nil {
		m.ran = map[time.Time]int{}
	}
	m.ran[run.Slot]++
	return nil
}

// unrun lists the slots of the n minutes after base that ran nowhere.
func (m *minuteRuns) unrun(base time.Time, n int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for i := 1; i <= n; i++ {
		if d := time.Duration(i) * time.Minute; m.ran[base.Add(d)] == 0 {
			out = append(out, fmt.Sprint(d))
		}
	}
	return out
}

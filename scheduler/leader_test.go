package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

// TestLeaderModeOnlyTheLeaderRuns: of two schedulers in leader mode, the
// follower skips every slot as "not the leader" without touching the job's
// lock, and takes over, with a greater term, when the leader stops.
func TestLeaderModeOnlyTheLeaderRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		name := uniqueName("leader")
		var journals [2]*journal
		var ss [2]*scheduler.Scheduler
		for i := range ss {
			journals[i] = new(journal)
			g := newGuard(t, mem, guard.WithTTL(time.Second))
			ss[i] = newScheduler(t, g, scheduler.WithInstance([]string{"a", "b"}[i]),
				scheduler.WithLeaderElection("reports"), scheduler.WithRunObserver(journals[i].observe))
			if err := ss[i].Add("@every 200ms", name, func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
		ss[0].Start()
		leaderRan := func() bool {
			for _, r := range journals[0].snapshot() {
				if r.Outcome == scheduler.Ran {
					return true
				}
			}
			return false
		}
		waitFor(t, "the first scheduler to lead and run", 10*time.Second, leaderRan)
		ss[1].Start()
		waitFor(t, "the follower to skip a slot", 10*time.Second, func() bool { return len(journals[1].snapshot()) > 0 })
		var term uint64
		for _, r := range journals[1].snapshot() {
			if r.Outcome != scheduler.Skipped || r.Reason != "not the leader" || r.Token != 0 {
				t.Fatalf("follower's run %+v, want skipped as not the leader without a lock", r)
			}
		}
		for _, r := range journals[0].snapshot() {
			if r.Outcome == scheduler.Ran {
				if r.Term == 0 {
					t.Fatalf("leader's run %+v has no term", r)
				}
				term = r.Term
			}
		}

		stop(t, ss[0])
		var taken scheduler.RunRecord
		waitFor(t, "the follower to take over", 10*time.Second, func() bool {
			for _, r := range journals[1].snapshot() {
				if r.Outcome == scheduler.Ran {
					taken = r
					return true
				}
			}
			return false
		})
		if taken.Term <= term {
			t.Fatalf("new leader's term %d after term %d", taken.Term, term)
		}
		stop(t, ss[1])
	})
}

// TestLeaderLossEndsTheRunAsLost: a job running when its node's leadership
// is lost has its context cancelled, and the run is recorded as lost.
func TestLeaderLossEndsTheRunAsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loser := &droppable{Locker: memory.New()}
		// droppable hides memory's ContextBounded: in a synctest bubble,
		// the Guard must keep no idle call goroutine past the test.
		g := newGuard(t, loser, guard.WithTTL(600*time.Millisecond), guard.WithIdleCallers(0))
		j := new(journal)
		s := newScheduler(t, g, scheduler.WithLeaderElection("e"), scheduler.WithRunObserver(j.observe))
		started := make(chan struct{}, 1)
		err := s.Add("@every 1s", uniqueName("long"), func(ctx context.Context) error {
			select {
			case started <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return context.Cause(ctx)
		}, scheduler.LockAtMostFor(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		defer stop(t, s)
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the job never started")
		}
		loser.dropElection.Store(true)
		r := j.first(t, scheduler.Lost)
		if !errors.Is(r.Err, guard.ErrLockLost) || r.Term == 0 {
			t.Fatalf("lost run %+v: want an error wrapping ErrLockLost and its term", r)
		}
		// The job returned the loss itself: the record says it once.
		if msg := r.Err.Error(); strings.Contains(msg, "\n") {
			t.Errorf("lost run's error %q: the loss is said twice", msg)
		}
	})
}

// TestElector: of two gocron Electors on one election, exactly one says it
// leads; when its Scheduler stops (resigning), the other leads.
func TestElector(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memory.New()
		var ss [2]*scheduler.Scheduler
		var es [2]gocron.Elector
		for i := range es {
			ss[i] = newScheduler(t, newGuard(t, mem, guard.WithTTL(time.Second)))
			e, err := ss[i].Elector("gocron-jobs")
			if err != nil {
				t.Fatal(err)
			}
			es[i] = e
		}
		ctx := context.Background()
		leader := -1
		waitFor(t, "one elector to lead", 10*time.Second, func() bool {
			a, b := es[0].IsLeader(ctx) == nil, es[1].IsLeader(ctx) == nil
			if a && b {
				t.Fatal("two electors lead at once")
			}
			switch {
			case a:
				leader = 0
			case b:
				leader = 1
			}
			return leader >= 0
		})
		other := 1 - leader
		if err := es[other].IsLeader(ctx); !errors.Is(err, scheduler.ErrNotLeader) {
			t.Fatalf("follower's IsLeader: %v, want ErrNotLeader", err)
		}
		stop(t, ss[leader])
		if err := es[leader].IsLeader(ctx); err == nil {
			t.Fatal("a stopped scheduler's elector still leads")
		}
		waitFor(t, "the other elector to lead", 10*time.Second, func() bool { return es[other].IsLeader(ctx) == nil })
		stop(t, ss[other])
		if _, err := ss[other].Elector("late"); !errors.Is(err, scheduler.ErrStopped) {
			t.Fatalf("Elector after Stop: %v, want ErrStopped", err)
		}
	})
}

func TestLeaderElectionNameIsChecked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGuard(t, memory.New())
		for _, bad := range []string{"", "bad\nname"} {
			if _, err := scheduler.New(g, scheduler.WithLeaderElection(bad)); !errors.Is(err, guard.ErrInvalidOption) {
				t.Errorf("WithLeaderElection(%q): %v, want ErrInvalidOption", bad, err)
			}
			if _, err := newScheduler(t, g).Elector(bad); !errors.Is(err, guard.ErrInvalidOption) {
				t.Errorf("Elector(%q): %v, want ErrInvalidOption", bad, err)
			}
		}
	})
}

// droppable is the memory backend whose election leases can be made to
// fail their renewals for good, as a deposed leader's would. It shows only
// the Locker methods, so every lease renews through Refresh.
type droppable struct {
	driver.Locker
	dropElection atomic.Bool
}

func (d *droppable) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	l, err := d.Locker.Acquire(ctx, key, o)
	if err != nil || !strings.Contains(key, "election:") {
		return l, err
	}
	return &dropLease{Lease: l, d: d}, nil
}

type dropLease struct {
	driver.Lease
	d *droppable
}

func (l *dropLease) Refresh(ctx context.Context, ttl time.Duration) error {
	if l.d.dropElection.Load() {
		return fmt.Errorf("%w: taken over", driver.ErrNotHeld)
	}
	return l.Lease.Refresh(ctx, ttl)
}

// A new leader whose clock is 10 minutes ahead of the old one's takes over
// a minutely job: the slots between the two clocks fell due on it while it
// followed, skipped as "not the leader", and on the old leader after it
// stopped leading, and ran nowhere.
func TestNewLeaderAheadLeavesNoSlotUnrun(t *testing.T) {
	t.Skip("defect: a new leader whose clock is ahead leaves the slots between the clocks unrun (10 of a minutely job, 10 minutes ahead); the package documentation says so")
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var m minuteRuns
		var ss []*scheduler.Scheduler
		for _, inst := range []string{"old", "new"} {
			opts := []scheduler.Option{scheduler.WithSlotStore(store), scheduler.WithLeaderElection("e"), scheduler.WithInstance(inst)}
			if inst == "new" {
				opts = append(opts, scheduler.WithClock(func() time.Time { return time.Now().Add(10 * time.Minute) }))
			}
			s := newScheduler(t, newGuard(t, locker, guard.WithTTL(2*time.Second)), opts...)
			if err := s.Add("0 * * * * *", "minutely", m.job); err != nil {
				t.Fatal(err)
			}
			ss = append(ss, s)
		}
		base := time.Now()
		ss[0].Start()
		// The old leader is elected first.
		time.Sleep(time.Second)
		ss[1].Start()
		time.Sleep(30 * time.Minute)
		stop(t, ss[0])
		time.Sleep(20 * time.Minute)
		stop(t, ss[1])
		if unrun := m.unrun(base, 50); len(unrun) > 0 {
			t.Errorf("of the first 50 slots, %v ran nowhere", unrun)
		}
	})
}

// A leader's run of a CatchUp job cut short by Stop gives its slot back,
// and the node that leads next runs it, within MisfireAfter, as a node
// watching the claim does without leader mode
// (TestCatchUpRunsASlotStopCutShort).
func TestNewLeaderCatchesUpASlotStopCutShort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var o outcomes
		started := make(chan scheduler.Run, 1)
		ranElsewhere := make(chan scheduler.Run, 1)
		var ss []*scheduler.Scheduler
		for _, inst := range []string{"leader", "next"} {
			s := bubbleScheduler(t, newGuard(t, locker, guard.WithTTL(2*time.Second)), inst, &o,
				scheduler.WithSlotStore(store), scheduler.WithLeaderElection("e"))
			err := s.Add("@every 1m", "report", func(ctx context.Context) error {
				run, _ := scheduler.RunFrom(ctx)
				if run.Instance == "leader" {
					started <- run
					<-ctx.Done()
					return context.Cause(ctx)
				}
				ranElsewhere <- run
				return nil
			}, scheduler.CatchUp(), scheduler.MisfireAfter(30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			ss = append(ss, s)
		}
		ss[0].Start()
		// The first node is elected before the second campaigns.
		time.Sleep(time.Second)
		ss[1].Start()
		cut := <-started
		time.Sleep(5 * time.Second)
		ss[0].Stop(context.Background())
		select {
		case run := <-ranElsewhere:
			if !run.Slot.Equal(cut.Slot) {
				t.Errorf("the next leader ran slot %v, want %v", run.Slot, cut.Slot)
			}
		case <-time.After(40 * time.Second):
			t.Errorf("the slot cut short was not caught up: %v", o.summary(cut.Slot))
		}
	})
}

// A follower keeps only the latest 64 slots of a CatchUp job in view: of a
// per-second job with MisfireAfter(10*time.Minute), followed for 100s, the
// slots before those have been let go, skipped as "not the leader". It
// kept every slot waiting for its 10 minutes, and would have kept 86,400
// with a MisfireAfter of a day.
func TestFollowerKeepsItsLatestSlotsInView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker, store := memory.New(), idempotency.NewMemoryStore()
		var o outcomes
		for _, inst := range []string{"leader", "follower"} {
			s := bubbleScheduler(t, newGuard(t, locker), inst, &o, scheduler.WithSlotStore(store), scheduler.WithLeaderElection("e"))
			err := s.Add("@every 1s", "tick", func(context.Context) error { return nil },
				scheduler.CatchUp(), scheduler.MisfireAfter(10*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
			// The first node is elected before the second campaigns.
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(100 * time.Second)
		synctest.Wait()
		var fired, let []time.Time
		for _, r := range o.all() {
			if r.Instance == "follower" {
				if r.Outcome != scheduler.Skipped || r.Reason != "not the leader" {
					t.Fatalf("follower's run %+v, want skipped as not the leader", r)
				}
				let = append(let, r.Slot)
			}
			if r.Instance == "leader" {
				fired = append(fired, r.Slot)
			}
		}
		// The follower fired the slots the leader ran.
		if want := len(fired) - 64; len(let) != want {
			t.Errorf("of %d slots, the follower let %d go, want all but the latest 64: %d", len(fired), len(let), want)
		}
	})
}

package scheduler_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

// The slots a follower of a CatchUp job keeps in view, and what the one
// that comes to lead does with them, in leader mode.

// slotRuns counts the runs of each slot, by instance.
type slotRuns struct {
	mu  sync.Mutex
	ran map[time.Time][]string
}

func (m *slotRuns) add(run scheduler.Run) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ran == nil {
		m.ran = map[time.Time][]string{}
	}
	m.ran[run.Slot] = append(m.ran[run.Slot], run.Instance)
}

// job records each run and takes took, or until its context ends.
func (m *slotRuns) job(took time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		run, _ := scheduler.RunFrom(ctx)
		m.add(run)
		select {
		case <-time.After(took):
		case <-ctx.Done():
		}
		return nil
	}
}

// twice fails t for each slot that ran more than once.
func (m *slotRuns) twice(t *testing.T) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	for slot, who := range m.ran {
		if len(who) > 1 {
			t.Errorf("slot %v ran %d times: on %v", slot.Format("Jan 2 15:04:05"), len(who), who)
		}
	}
}

// leaderPair adds the job "report" to two schedulers, "old" and "new",
// in leader mode on one lock backend and slot store, and starts "old",
// then "new" once "old" leads.
func leaderPair(t *testing.T, o *outcomes, spec string, fn func(context.Context) error, opts ...scheduler.JobOption) []*scheduler.Scheduler {
	t.Helper()
	locker, store := memory.New(), idempotency.NewMemoryStore()
	var ss []*scheduler.Scheduler
	for _, inst := range []string{"old", "new"} {
		s := bubbleScheduler(t, newGuard(t, locker, guard.WithTTL(2*time.Second)), inst, o,
			scheduler.WithSlotStore(store), scheduler.WithLeaderElection("e"))
		if err := s.Add(spec, "report", fn, opts...); err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	ss[0].Start()
	time.Sleep(time.Second)
	ss[1].Start()
	return ss
}

// A follower lets a slot go before the old leader's record of it may have
// expired: with SlotRetention(5*time.Minute) and MisfireAfter(30*time.Minute),
// the follower kept the last 30 minutes of slots in view, and on coming to
// lead ran again those whose records had gone (15 of the 20 slots the old
// leader ran).
func TestNewLeaderRunsNoSlotWhoseRecordExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o outcomes
		var m slotRuns
		ss := leaderPair(t, &o, "@every 1m", m.job(0), scheduler.CatchUp(), scheduler.MisfireAfter(30*time.Minute), scheduler.SlotRetention(5*time.Minute))
		time.Sleep(20 * time.Minute)
		ss[0].Stop(context.Background())
		time.Sleep(5 * time.Minute)
		m.twice(t)
	})
}

// The same with the default SlotRetention of a day: a daily job with
// MisfireAfter(36*time.Hour), its leader stopped the next morning; the new
// leader ran the day's slot again.
func TestNewLeaderRunsNoDailySlotTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o outcomes
		var m slotRuns
		ss := leaderPair(t, &o, "@daily", m.job(time.Minute), scheduler.CatchUp(), scheduler.MisfireAfter(36*time.Hour))
		time.Sleep(54 * time.Hour)
		ss[0].Stop(context.Background())
		time.Sleep(time.Hour)
		m.twice(t)
	})
}

// A slot the leader skipped because the job's lock was held (its previous
// run overran) stays skipped when another node comes to lead: the new
// leader ran them all, late and out of order, while skipping its own
// current slots for the lock its catch-ups held (5 slots of a minutely
// job that takes 90s).
func TestNewLeaderRunsNoSlotSkippedForAHeldLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o outcomes
		var m slotRuns
		ss := leaderPair(t, &o, "@every 1m", m.job(90*time.Second), scheduler.CatchUp(), scheduler.MisfireAfter(30*time.Minute))
		time.Sleep(10*time.Minute + 30*time.Second)
		ss[0].Stop(context.Background())
		time.Sleep(10 * time.Minute)
		m.twice(t)
		var held []time.Time
		for _, r := range o.all() {
			if r.Instance == "old" && r.Reason == "lock held" {
				held = append(held, r.Slot)
			}
		}
		if len(held) == 0 {
			t.Fatalf("the old leader skipped no slot for a held lock: %v", o.summary(time.Time{}))
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, slot := range held {
			if who := m.ran[slot]; len(who) > 0 {
				t.Errorf("slot %v, which the old leader skipped for a held lock, ran on %v", slot.Format("15:04:05"), who)
			}
		}
	})
}

// A follower's Locker (gocron) and Wrap (robfig/cron) runs of a CatchUp job
// return at once, as every follower run did: they fire in their caller's
// goroutine, which waited for the whole MisfireAfter (an hour) for the
// node to lead, gocron's Lock ignoring its context, robfig/cron's Stop
// waiting for them.
func TestFollowerLockerAndWrapReturnAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o outcomes
		ss := leaderPair(t, &o, "@every 1m", func(context.Context) error { return nil },
			scheduler.CatchUp(), scheduler.MisfireAfter(time.Minute))
		time.Sleep(time.Second)
		follower := ss[1]
		opts := []scheduler.JobOption{scheduler.CatchUp(), scheduler.MisfireAfter(time.Hour)}

		l, err := follower.Locker(opts...)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := l.Lock(context.Background(), "gocron-job"); err == nil {
			t.Error("a follower's Lock succeeded")
		}
		if took := time.Since(start); took > 0 {
			t.Errorf("a follower's Lock took %v", took)
		}

		w, err := follower.Wrap("robfig-job", opts...)
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		w(cron.FuncJob(func() { t.Error("a follower ran a Wrap'd job") })).Run()
		if took := time.Since(start); took > 0 {
			t.Errorf("a follower's Wrap'd run took %v", took)
		}
	})
}

// A run the new leader took over is measured from when it took its lock,
// not from when it fired as a follower: the 5s the slot was kept in view
// and the wait for the old leader's lock were reported as an overrun of
// LockAtMostFor(2*time.Second) by a run that took no time.
func TestTakenOverRunIsNotAnOverrun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var o outcomes
		started, cut := make(chan time.Time, 1), make(chan struct{})
		ss := leaderPair(t, &o, "@every 1m", func(ctx context.Context) error {
			run, _ := scheduler.RunFrom(ctx)
			if run.Instance == "old" {
				// It outlives LockAtMostFor, to be cut short by Stop.
				started <- run.Slot
				<-cut
				return errors.New("cut short")
			}
			return nil
		}, scheduler.CatchUp(), scheduler.MisfireAfter(30*time.Second), scheduler.LockAtMostFor(2*time.Second))
		slot := <-started
		time.Sleep(5 * time.Second)
		go ss[0].Stop(context.Background())
		synctest.Wait()
		close(cut)
		time.Sleep(30 * time.Second)
		caughtUp := false
		for _, r := range o.all() {
			if r.Instance == "new" && r.Slot.Equal(slot) && r.Outcome == scheduler.Ran {
				caughtUp = true
				if r.Reason != "" {
					t.Errorf("the run caught up was reported: %s", r.Reason)
				}
			}
		}
		if !caughtUp {
			t.Errorf("slot %v was not caught up: %v", slot, o.summary(slot))
		}
	})
}

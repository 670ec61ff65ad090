package scheduler

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"

	"github.com/warden-go/warden/guard"
)

// Wrap returns a robfig/cron JobWrapper for a program that keeps its own
// cron.Cron: each firing of the wrapped job takes the same path as a job
// added to the Scheduler (misfire bound, slot claim, lock, LockAtLeastFor,
// panic recovery, span, metrics, log and RunObserver), with the same
// options and defaults. The Scheduler need not be started; Stop still ends
// the holds and makes later firings do nothing.
//
// robfig/cron fires on whole seconds of each node's clock, and the slot of
// a firing is the Scheduler's clock, read when the wrapper is called,
// truncated to the second: every node names the same slot whatever its
// clock's skew, as long as the wrapper is called within the second the
// firing is for, and with a slot store the job runs once per slot. A
// firing that reaches the wrapper a second or more late names the next
// slot, and runs again: a process stalled past a second at a firing, or a
// wrapper behind one that delays a run (cron.DelayIfStillRunning). WrapSpec,
// which is told the job's spec, names each firing's slot from it instead,
// late or not: prefer it. That holds for cron specs and descriptors, not
// for robfig/cron's "@every D": it fires on the whole seconds D apart from
// when each process added the job, so processes started at different
// seconds name different slots and each runs the job, kept apart only by
// the lock and LockAtLeastFor. WrapSpec and Add align such slots to the
// Scheduler's anchor. Without a slot store, the lock is kept for
// DefaultLockAtLeastFor, a second, unless LockAtLeastFor says otherwise: a
// wrapped job that fires every second should set it shorter (half a
// second), or its hold takes the next firing's slot. A cron.Job takes no
// context, so neither a lost lock nor LockAtMostFor can stop it; they are
// recorded.
func (s *Scheduler) Wrap(name string, opts ...JobOption) (cron.JobWrapper, error) {
	j, err := s.newJob(name, 0, opts)
	if err != nil {
		return nil, err
	}
	j.spec = "robfig/cron"
	return s.wrapper(j, func() time.Time { return s.clock().Truncate(time.Second) })
}

// WrapSpec is Wrap for a job that robfig/cron runs on spec, the spec given
// to its AddJob, read as Add reads one (the Scheduler's syntax, location
// and anchor): the slot of each firing is the latest instant spec names at
// or before the wrapper's call, on the Scheduler's clock, not that clock
// truncated to the second. A firing that reaches the wrapper late (on a
// process stalled at the firing, or behind cron.DelayIfStillRunning) names
// its own slot all the same, and with a slot store still runs once, if it
// is late by less than spec's shortest interval; and "@every D" names slots
// aligned to the Scheduler's anchor, as Add's are, so that processes whose
// crons started at different seconds name the same ones (robfig/cron fires
// "@every D" on whole seconds, so D must be whole seconds, and the anchor on
// one). Give the cron the Scheduler's location (cron.WithLocation;
// time.Local for both by default): a spec read in two zones names two
// instants, and a firing that comes more than 10 minutes after the latest
// slot the spec names is logged at Warn, since the slot it takes may have
// run already.
func (s *Scheduler) WrapSpec(spec, name string, opts ...JobOption) (cron.JobWrapper, error) {
	j, sched, err := s.specJob(spec, name, opts)
	if err != nil {
		return nil, err
	}
	// robfig/cron fires "@every D" on whole seconds, D rounded down to
	// them: slots of another D, or off the whole seconds, would not be
	// the firings'.
	if cd, ok := sched.(cron.ConstantDelaySchedule); ok && (cd.Delay%time.Second != 0 || !s.anchor.Equal(s.anchor.Truncate(time.Second))) {
		return nil, fmt.Errorf("%w: %q: robfig/cron fires %q on whole seconds: WrapSpec needs a whole number of seconds, and the Scheduler's anchor (%v) on a whole second",
			ErrInvalidJob, name, spec, s.anchor)
	}
	slots, interval := newSlotSchedule(sched, s.anchor, s.clock), shortestInterval(sched)
	return s.wrapper(j, func() time.Time {
		now := s.clock().In(s.location)
		slot := slots.atOrBefore(now, interval)
		if late := now.Sub(slot); late > wrapSpecLate {
			// A cron that reads the spec in another zone (or runs another
			// spec) fires where this spec names no slot: the firing takes
			// the slot before it, which another firing may have run.
			s.logger.Warn("warden/scheduler: a firing came long after the latest slot of the job's spec: is the cron reading the spec in another time zone than the Scheduler's, or running another spec?",
				"job", j.name, "spec", spec, "location", s.location.String(), "slot", slot, "late", late)
		}
		return slot
	})
}

// wrapSpecLate is how long after its slot a firing of WrapSpec's job may
// come before it is told as one the spec does not name: longer than a stall
// commonly holds a firing up, shorter than most zones' offsets from one
// another (an hour or more; a few differ by 30 or 45 minutes, and fewer
// still by 15, which this does not tell).
const wrapSpecLate = 10 * time.Minute

// wrapper registers j and returns the JobWrapper that runs it, in the slot
// slotOf names when a firing calls it.
func (s *Scheduler) wrapper(j *job, slotOf func() time.Time) (cron.JobWrapper, error) {
	if err := s.register(j); err != nil {
		return nil, err
	}
	return func(inner cron.Job) cron.Job {
		fn := func(context.Context) error {
			inner.Run()
			return nil
		}
		return cron.FuncJob(func() {
			if !s.enter() {
				return
			}
			defer s.runs.Done()
			j.run(slotOf(), fn)
		})
	}, nil
}

// Locker returns a go-co-op/gocron/v2 Locker (gocron.WithDistributedLocker)
// that takes gocron's runs through the same path as a job added to the
// Scheduler, with the same options and defaults, the job named by gocron's
// key. gocron calls Lock before a run and Unlock after it: a run that is
// skipped (slot claimed elsewhere, lock held, misfired) makes Lock fail, and
// Unlock returns at once while the LockAtLeastFor hold and the release go on
// in the background (Stop ends them).
//
// The slot of a run is the Scheduler's clock truncated to the second, which
// names the same slot on every node for gocron's cron and
// wall-clock-aligned jobs; gocron's duration jobs start from each process's
// start time, so only the lock and LockAtLeastFor keep their runs apart.
// gocron does not hand the lock's context to the job, so a lost lock is
// recorded but cannot cancel it.
func (s *Scheduler) Locker(opts ...JobOption) (gocron.Locker, error) {
	// Checked once here, so that Lock fails only on a bad key.
	if _, err := s.newJob("gocron", 0, opts); err != nil {
		return nil, err
	}
	return &gocronLocker{s: s, opts: opts, jobs: map[string]*job{}}, nil
}

// register adds j to the jobs Entries lists, refusing a second job of the
// same name.
func (s *Scheduler) register(j *job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.names[j.name] {
		return fmt.Errorf("%w: %q", ErrDuplicateJob, j.name)
	}
	s.names[j.name] = true
	s.jobs = append(s.jobs, j)
	return nil
}

type gocronLocker struct {
	s    *Scheduler
	opts []JobOption

	mu   sync.Mutex
	jobs map[string]*job
}

func (l *gocronLocker) job(key string) (*job, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j, ok := l.jobs[key]; ok {
		return j, nil
	}
	j, err := l.s.newJob(key, 0, l.opts)
	if err != nil {
		return nil, err
	}
	j.spec = "gocron"
	if err := l.s.register(j); err != nil {
		return nil, err
	}
	l.jobs[key] = j
	return j, nil
}

// Lock implements gocron.Locker.
func (l *gocronLocker) Lock(_ context.Context, key string) (gocron.Lock, error) {
	j, err := l.job(key)
	if err != nil {
		return nil, err
	}
	if !l.s.enter() {
		return nil, ErrStopped
	}
	r, ok := j.begin(l.s.clock().Truncate(time.Second))
	if !ok {
		l.s.runs.Done()
		return nil, fmt.Errorf("%w: %s run of %q: %s", guard.ErrNotAcquired, r.rec.Outcome, key, r.rec.Reason)
	}
	return &gocronRun{s: l.s, r: r}, nil
}

type gocronRun struct {
	s    *Scheduler
	r    *running
	once sync.Once
}

// Unlock implements gocron.Lock.
func (g *gocronRun) Unlock(context.Context) error {
	g.once.Do(func() {
		go func() {
			defer g.s.runs.Done()
			g.r.end(nil)
		}()
	})
	return nil
}

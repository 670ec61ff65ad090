package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
)

// Outcome is how a run ended.
type Outcome string

// The outcomes of a run.
const (
	// Ran: the job ran to the end and returned nil.
	Ran Outcome = "ran"
	// Skipped: the slot was claimed elsewhere or the lock was held.
	Skipped Outcome = "skipped"
	// Failed: the job returned an error or panicked, or the slot store or
	// the lock backend failed before it could start.
	Failed Outcome = "failed"
	// Lost: the lock was lost while the job ran; its context was cancelled.
	Lost Outcome = "lost"
	// Misfired: the run would have started later than MisfireAfter after
	// its slot, and did not start.
	Misfired Outcome = "misfired"
)

// Run describes the run a job context belongs to. Get it with RunFrom.
type Run struct {
	// Job is the job's name.
	Job string
	// Slot is the scheduled fire time the run is for, the same on every
	// node.
	Slot time.Time
	// Instance names the scheduler running the job.
	Instance string
	// Lock is the job's held lock; pass Lock.Token() to the storage the job
	// writes, so that a run that outlived its lock cannot overwrite a newer
	// one's work.
	Lock *guard.Lock
}

type runKey struct{}

// RunFrom returns the run a job's context belongs to.
func RunFrom(ctx context.Context) (Run, bool) {
	r, ok := ctx.Value(runKey{}).(*Run)
	if !ok {
		return Run{}, false
	}
	return *r, true
}

// RunRecord is what a RunObserver is told of each run.
type RunRecord struct {
	Job      string
	Slot     time.Time
	Instance string
	// Token is the lock's fencing token, 0 when the lock was not taken.
	Token uint64
	// Started is when the run began, on the scheduler's clock; Finished
	// when the job returned (or the run was given up).
	Started, Finished time.Time
	Outcome           Outcome
	// Reason says why a run was skipped or misfired.
	Reason string
	// Err is the job's error for a failed or lost run.
	Err error
}

// job is one added job: robfig/cron's Job for it.
type job struct {
	s        *Scheduler
	name     string
	fn       func(context.Context) error
	cfg      jobConfig
	slots    *slotSchedule
	lockOpts []guard.LockOption
}

// Run implements cron.Job: one firing.
func (j *job) Run() {
	slot, ok := j.slots.fired()
	if !ok {
		return
	}
	s := j.s
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.runs.Add(1)
	s.mu.Unlock()
	defer s.runs.Done()
	j.run(slot)
}

func (j *job) run(slot time.Time) {
	s := j.s
	rec := RunRecord{Job: j.name, Slot: slot, Instance: s.instance, Started: s.clock()}
	ctx, span := s.tel.start(s.ctx, &rec)
	defer func() {
		// A panic in the bookkeeping below (a user observer, a store) must
		// not take the process down with it.
		if r := recover(); r != nil {
			s.logger.Error("warden/scheduler: panic while recording a run", "job", j.name, "panic", r)
		}
	}()

	if lag := rec.Started.Sub(slot); j.cfg.misfireAfter > 0 && lag > j.cfg.misfireAfter {
		j.finish(ctx, span, &rec, Misfired, fmt.Sprintf("started %v after its slot", lag), nil)
		return
	}

	claim, err := j.claim(ctx, slot)
	switch {
	case err != nil:
		j.finish(ctx, span, &rec, Failed, "slot store", err)
		return
	case claim.held != "":
		j.finish(ctx, span, &rec, Skipped, claim.held, nil)
		return
	}

	l, err := s.g.Lock(ctx, j.name, j.lockOpts...)
	if err != nil {
		claim.abandon(ctx)
		if errors.Is(err, guard.ErrNotAcquired) {
			j.finish(ctx, span, &rec, Skipped, "lock held", nil)
		} else {
			j.finish(ctx, span, &rec, Failed, "lock", err)
		}
		return
	}
	locked := time.Now()
	rec.Token = l.Token()
	// Waiting for the lock may have made the run late.
	if lag := s.clock().Sub(slot); j.cfg.misfireAfter > 0 && lag > j.cfg.misfireAfter {
		claim.abandon(ctx)
		j.release(ctx, l, locked)
		j.finish(ctx, span, &rec, Misfired, fmt.Sprintf("lock taken %v after its slot", lag), nil)
		return
	}

	err = j.call(l, slot)
	rec.Finished = s.clock()
	outcome := Ran
	switch {
	case errors.Is(l.Err(), guard.ErrLockLost):
		outcome, err = Lost, errors.Join(err, l.Err())
	case err != nil:
		outcome = Failed
	}
	if outcome == Ran {
		claim.complete(ctx, "ran")
	} else if j.cfg.retryFailed {
		claim.abandon(ctx)
	} else {
		claim.complete(ctx, string(outcome)+": "+err.Error())
	}
	j.finish(ctx, span, &rec, outcome, "", err)
	j.release(ctx, l, locked)
}

// call runs the job under the lock's context, capped at LockAtMostFor, and
// turns a panic into an error.
func (j *job) call(l *guard.Lock, slot time.Time) (err error) {
	ctx, cancel := context.WithTimeoutCause(l.Context(), j.cfg.atMost, ErrLockAtMostFor)
	defer cancel()
	ctx = context.WithValue(ctx, runKey{}, &Run{Job: j.name, Slot: slot, Instance: j.s.instance, Lock: l})
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrPanicked, r, debug.Stack())
		}
	}()
	return j.fn(ctx)
}

// release gives the lock up once LockAtLeastFor has passed since it was
// taken, or at once when Stop's bound runs out.
func (j *job) release(ctx context.Context, l *guard.Lock, locked time.Time) {
	if wait := j.cfg.atLeast - time.Since(locked); wait > 0 && l.Err() == nil {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-j.s.hurry:
			t.Stop()
		}
	}
	if err := l.Unlock(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, guard.ErrLockLost) {
		j.s.logger.Warn("warden/scheduler: unlock failed", "job", j.name, "error", err)
	}
}

// finish records the outcome of a run everywhere.
func (j *job) finish(ctx context.Context, span trace.Span, rec *RunRecord, o Outcome, reason string, err error) {
	s := j.s
	if rec.Finished.IsZero() {
		rec.Finished = s.clock()
	}
	rec.Outcome, rec.Reason, rec.Err = o, reason, err
	s.tel.end(ctx, span, rec)
	attrs := []any{"job", rec.Job, "slot", rec.Slot, "instance", rec.Instance, "outcome", o}
	switch o {
	case Ran:
		s.logger.DebugContext(ctx, "warden/scheduler: ran", append(attrs, "token", rec.Token, "took", rec.Finished.Sub(rec.Started))...)
	case Skipped:
		s.logger.InfoContext(ctx, "warden/scheduler: skipped", append(attrs, "reason", reason)...)
	default:
		s.logger.WarnContext(ctx, "warden/scheduler: run did not succeed", append(attrs, "token", rec.Token, "reason", reason, "error", err)...)
	}
	if s.observer != nil {
		s.observer(*rec)
	}
}

// slotClaim is a run's claim on its slot in the slot store. Its zero value
// (no store) claims nothing.
type slotClaim struct {
	j     *job
	key   string
	owner string
	// held says who has the slot when it could not be claimed.
	held string
}

// claimMargin pads the claim's lease past the longest a run can last, for
// the store round trips around it.
const claimMargin = 30 * time.Second

func (j *job) claim(ctx context.Context, slot time.Time) (slotClaim, error) {
	store := j.s.store
	if store == nil {
		return slotClaim{}, nil
	}
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	c := slotClaim{j: j, key: j.name + "@" + slot.UTC().Format(time.RFC3339Nano), owner: j.s.instance + ":" + hex.EncodeToString(b[:])}
	// The claim lives as long as a run can: the wait for the lock plus the
	// cap. A node that dies mid-run keeps this one slot claimed; later
	// slots are claimed afresh.
	rec, err := store.Claim(ctx, idempotency.Claim{
		Scope: slotScope, Key: c.key, Owner: c.owner, Lease: j.cfg.wait + j.cfg.atMost + claimMargin,
	})
	if err != nil {
		return slotClaim{}, err
	}
	if rec != nil {
		c.owner = ""
		c.held = fmt.Sprintf("slot %s by %s", rec.State, instanceOf(rec.Owner))
	}
	return c, nil
}

func instanceOf(owner string) string {
	if i := len(owner) - 33; i > 0 && owner[i] == ':' {
		return owner[:i]
	}
	return owner
}

// storeTimeout bounds the store calls that end a claim; they run on a
// context detached from Stop's cancellation so that a stopped run still
// records its slot.
const storeTimeout = 10 * time.Second

func (c slotClaim) complete(ctx context.Context, result string) {
	if c.owner == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	if err := c.j.s.store.Complete(ctx, slotScope, c.key, c.owner, []byte(result), c.j.cfg.retention); err != nil {
		c.j.s.logger.WarnContext(ctx, "warden/scheduler: could not mark the slot done; it may run again elsewhere once its claim expires",
			"job", c.j.name, "slot", c.key, "error", err)
	}
}

func (c slotClaim) abandon(ctx context.Context) {
	if c.owner == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	if err := c.j.s.store.Abandon(ctx, slotScope, c.key, c.owner); err != nil {
		c.j.s.logger.WarnContext(ctx, "warden/scheduler: could not give the slot back", "job", c.j.name, "slot", c.key, "error", err)
	}
}

package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
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
	// Failed: the job returned an error, panicked or called runtime.Goexit,
	// or the slot store or the lock backend failed before it could start.
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
	// Term is the leader's term the run goes ahead under, with
	// WithLeaderElection; 0 otherwise.
	Term uint64
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
	// Term is the leader's term the run went ahead under, with
	// WithLeaderElection; 0 otherwise.
	Term uint64
	// Started is when the run began, on the scheduler's clock (before any
	// wait for the lock, or, on a follower, for its node to lead);
	// Finished when the job returned (or the run was given up).
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
	spec     string
	fn       func(context.Context) error
	cfg      jobConfig
	slots    *slotSchedule
	lockOpts []guard.LockOption

	mu   sync.Mutex
	last *RunRecord
	// inView ends the waits of the follower runs keeping a slot of a
	// CatchUp job in view (keepInView), oldest first.
	inView []*context.CancelFunc
}

// maxInView bounds the slots of a CatchUp job a follower keeps in view at
// once: a newer slot lets the oldest go. Without it a follower of a
// per-second job with a MisfireAfter of a day would keep 86,400 runs
// waiting; the slots a leader's death leaves unfinished are its last ones.
const maxInView = 64

// keepInView waits, as a follower, for this node to lead within wait, and
// returns the term, or nil when it does not lead by then, ctx is done, or
// maxInView newer slots of the job came to be kept in view meanwhile.
func (j *job) keepInView(ctx context.Context, wait time.Duration) *guard.Leadership {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	j.mu.Lock()
	if len(j.inView) == maxInView {
		(*j.inView[0])()
		j.inView = j.inView[1:]
	}
	j.inView = append(j.inView, &cancel)
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		j.inView = slices.DeleteFunc(j.inView, func(c *context.CancelFunc) bool { return c == &cancel })
		j.mu.Unlock()
	}()
	return j.s.cand.await(ctx, wait)
}

// inViewUntil is when a follower lets slot go: once it is MisfireAfter
// old, and before its record may have expired from the store. A leader
// records a slot it finished for SlotRetention from when it finished it,
// no earlier than the slot on its own clock; a follower that claimed the
// slot after the record had gone would run it again. Half the retention
// leaves the other half for the nodes' clocks to be apart.
func (j *job) inViewUntil(slot time.Time) time.Time {
	return slot.Add(min(j.cfg.misfireAfter, j.cfg.retention/2))
}

func (j *job) lastRun() *RunRecord {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.last == nil {
		return nil
	}
	r := *j.last
	return &r
}

// Run implements cron.Job: one firing.
func (j *job) Run() {
	slot, ok := j.slots.fired()
	if !ok {
		return
	}
	if !j.s.enter() {
		return
	}
	defer j.s.runs.Done()
	j.run(slot, j.fn)
}

// passedOver records the n slots from first to last that the timer never
// fired (see slotSchedule.handed) as one misfired outcome under first's
// slot, rather than one per slot, which a long stall would turn into a
// flood. It is called on robfig/cron's loop, which must not wait for the
// observer and the log.
func (j *job) passedOver(first, last time.Time, n int) {
	s := j.s
	if !s.enter() {
		return
	}
	go func() {
		defer s.runs.Done()
		defer func() {
			if p := recover(); p != nil {
				s.logger.Error("warden/scheduler: panic while recording slots never fired", "job", j.name, "panic", p)
			}
		}()
		r := &running{j: j, rec: RunRecord{Job: j.name, Slot: first, Instance: s.instance, Started: s.clock()}}
		r.ctx, r.span = s.tel.start(s.ctx, &r.rec)
		reason := "never fired: the timer ran late"
		if n > 1 {
			reason = fmt.Sprintf("never fired, nor the %d slots after it up to %v: the timer ran late", n-1, last)
		}
		r.finish(Misfired, reason, nil)
	}()
}

// run is the one path every run takes, whoever fired it (the Scheduler's
// timer, a robfig/cron Wrap, a gocron Locker): begin, the job, end.
func (j *job) run(slot time.Time, fn func(context.Context) error) {
	r, ok := j.begin(slot)
	if !ok {
		return
	}
	// The run is ended from a defer: a job that calls runtime.Goexit (a
	// t.FailNow in a job under test) returns nothing, and a run not ended
	// keeps its lock renewed for the life of the process.
	err := ErrExited
	defer func() { r.end(err) }()
	err = j.call(r, fn)
}

// running is a run that holds its lock (and its slot claim, with a store).
type running struct {
	j      *job
	ctx    context.Context
	span   trace.Span
	rec    RunRecord
	claim  slotClaim
	lock   *guard.Lock
	locked time.Time
	// began is when the lock was taken and the job could start, on the
	// scheduler's clock: what it ran is measured from there, not from
	// rec.Started, which also counts the waits for a term and the lock.
	began time.Time
	// term is the leadership the run went ahead under (WithLeaderElection),
	// and leave detaches the lock's context from it once the lock is gone.
	term  *guard.Leadership
	leave func()
	// done guards against a second end (a gocron Unlock called twice).
	done sync.Once
}

// begin checks the misfire bound, claims the slot and takes the lock. It
// returns false, with the outcome recorded in r.rec, when the run does not
// go ahead.
func (j *job) begin(slot time.Time) (r *running, ok bool) {
	s := j.s
	// tookOver: the run waited, as a follower, for its node to lead.
	tookOver := false
	r = &running{j: j, rec: RunRecord{Job: j.name, Slot: slot, Instance: s.instance, Started: s.clock()}}
	r.ctx, r.span = s.tel.start(s.ctx, &r.rec)
	defer func() {
		// A panic in the bookkeeping (a user observer, a store) must not
		// take the process down with it.
		if p := recover(); p != nil {
			s.logger.Error("warden/scheduler: panic while starting a run", "job", j.name, "panic", p)
			if r.lock != nil {
				r.lock.Unlock(context.WithoutCancel(r.ctx))
			}
			// The store may be what panicked: the claim is left to lapse.
			if r.claim.stop != nil {
				r.claim.stop()
			}
			// Ending a span twice is harmless; leaving one open is a leak.
			r.span.End()
			r.rec.Outcome, r.rec.Reason, ok = Failed, fmt.Sprint("panic: ", p), false
		}
	}()
	if lag := r.rec.Started.Sub(slot); j.cfg.misfireAfter > 0 && lag > j.cfg.misfireAfter {
		r.finish(Misfired, fmt.Sprintf("started %v after its slot", lag), nil)
		return r, false
	}
	if s.cand != nil {
		// Followers skip before touching the store or the lock: sparing
		// them that is what leadership is for.
		r.term = s.cand.leading()
		// Only the Scheduler's own timer (j.slots) fires a run on a
		// goroutine of its own: Wrap and Locker fire in their caller's
		// (robfig/cron's, gocron's), which must not wait for a term.
		if tookOver = r.term == nil && j.cfg.catchUp && j.slots != nil; tookOver {
			// No follower watches the claim of a CatchUp slot, as nodes
			// do without leader mode: a follower keeps the slot in view
			// instead (inViewUntil). Should it lead by then (its leader
			// died or was stopped mid-run), it claims the slot as a
			// leader does, and catches it up if nobody finished it.
			r.term = j.keepInView(r.ctx, j.inViewUntil(slot).Sub(s.clock()))
		}
		if r.term == nil {
			r.finish(Skipped, "not the leader", nil)
			return r, false
		}
		r.rec.Term = r.term.Term()
	}
	claim, err := j.claim(r.ctx, slot)
	if err == nil && claim.running && j.cfg.catchUp {
		claim, err = j.catchUp(r.ctx, slot, claim)
	}
	switch {
	case err != nil:
		r.finish(Failed, "slot store", err)
		return r, false
	case claim.held != "":
		r.finish(Skipped, claim.held, nil)
		return r, false
	}
	r.claim = claim
	r.claim.keep(r.ctx)
	lockOpts := j.lockOpts
	if claim.caughtUp != "" || tookOver {
		// The dead runner's lock lapses about when its claim did, and a
		// stopped one's goes just after it gave the claim back: wait for
		// it, within the slot's window.
		left := max(slot.Add(j.cfg.misfireAfter).Sub(s.clock()), 0)
		lockOpts = append(lockOpts[:len(lockOpts):len(lockOpts)], guard.WaitAtMost(left))
	}
	if claim.caughtUp != "" {
		s.logger.WarnContext(r.ctx, "warden/scheduler: catching up a slot whose runner did not finish it",
			"job", j.name, "slot", slot, "previous", claim.caughtUp)
	}
	lockCtx := r.ctx
	if r.term != nil {
		lockCtx, r.leave = underTerm(r.ctx, r.term)
	}
	l, err := s.g.Lock(lockCtx, j.name, lockOpts...)
	if err != nil {
		if r.leave != nil {
			r.leave()
		}
		if errors.Is(err, guard.ErrNotAcquired) {
			r.skipHeld()
		} else {
			r.claim.abandon(r.ctx)
			r.finish(Failed, "lock", err)
		}
		return r, false
	}
	r.lock, r.locked, r.began = l, time.Now(), s.clock()
	r.rec.Token = l.Token()
	// A lock lost as soon as it was taken (its session revoked, forced
	// away) must not start the job: the slot, which nothing ran, is given
	// back rather than recorded as run. (One granted too late to be held
	// guard refuses itself.)
	if err := l.Err(); err != nil {
		r.claim.abandon(r.ctx)
		r.unlock()
		r.finish(Failed, "lock", err)
		return r, false
	}
	// Waiting for the lock may have made the run late.
	if lag := s.clock().Sub(slot); j.cfg.misfireAfter > 0 && lag > j.cfg.misfireAfter {
		r.claim.abandon(r.ctx)
		// The job did not run: there is nothing for LockAtLeastFor to keep
		// apart.
		r.unlock()
		r.finish(Misfired, fmt.Sprintf("lock taken %v after its slot", lag), nil)
		return r, false
	}
	// The claim may have lapsed while the lock was awaited (a paused
	// process, a long WaitForLock), and another node caught the slot up,
	// ran and completed it: the lock alone would not tell, since that node
	// let it go. An owner-checked renewal tells; it never revives a lapsed
	// claim.
	if err := r.claim.confirm(r.ctx); err != nil {
		r.unlock()
		if errors.Is(err, idempotency.ErrNotOwner) {
			r.claim.drop()
			r.finish(Skipped, "slot claim lapsed before the lock was taken", nil)
		} else {
			r.claim.abandon(r.ctx)
			r.finish(Failed, "slot store", err)
		}
		return r, false
	}
	return r, true
}

// skipHeld ends a run that found its job's lock held. Without leader mode
// it gives the slot back, for a node that fires later for it. A leader
// records it skipped instead: no other node fires for it, and a follower
// that comes to lead while keeping the slot in view must tell it from a
// slot its leader left unfinished, which it catches up (the held lock is
// a skip on the next leader as on this one).
func (r *running) skipHeld() {
	if r.term != nil {
		r.claim.complete(r.ctx, "skipped: lock held")
	} else {
		r.claim.abandon(r.ctx)
	}
	r.finish(Skipped, "lock held", nil)
}

// end records the job's result err, completes or gives back the slot, and
// releases the lock once LockAtLeastFor has passed.
func (r *running) end(err error) {
	r.done.Do(func() {
		defer func() {
			if p := recover(); p != nil {
				r.j.s.logger.Error("warden/scheduler: panic while recording a run", "job", r.j.name, "panic", p)
			}
			r.release()
		}()
		j := r.j
		r.rec.Finished = j.s.clock()
		outcome, reason := Ran, ""
		switch {
		case errors.Is(r.lock.Err(), guard.ErrLockLost):
			outcome, err = Lost, withLoss(err, r.lock.Err())
		case r.term != nil && errors.Is(r.term.Err(), guard.ErrLockLost):
			outcome, err = Lost, withLoss(err, r.term.Err())
		case err != nil:
			outcome = Failed
		}
		if took := r.rec.Finished.Sub(r.began); took > j.cfg.atMost {
			reason = fmt.Sprintf("overran LockAtMostFor %v: ran %v", j.cfg.atMost, took)
		}
		// A run Stop cut short did not finish its slot: under CatchUp,
		// whose jobs are safe to run again for such a slot, it is given
		// back for the nodes watching it, as a dead runner's would lapse.
		stopped := j.cfg.catchUp && errors.Is(context.Cause(r.ctx), ErrStopped)
		if outcome == Ran {
			r.claim.complete(r.ctx, "ran")
		} else if j.cfg.retryFailed || stopped {
			r.claim.abandon(r.ctx)
		} else {
			r.claim.complete(r.ctx, string(outcome)+": "+err.Error())
		}
		r.finish(outcome, reason, err)
	})
}

// withLoss is the error of a run whose lock (or term) was lost: the job's
// own, and the loss, which a job that returned its context's cause
// returned already and which is then not said twice.
func withLoss(err, loss error) error {
	if errors.Is(err, loss) {
		return err
	}
	return errors.Join(err, loss)
}

// call runs the job under the lock's context, capped at LockAtMostFor, and
// turns a panic into an error.
func (j *job) call(r *running, fn func(context.Context) error) (err error) {
	l, slot := r.lock, r.rec.Slot
	capped, cancel := context.WithTimeoutCause(l.Context(), j.cfg.atMost, ErrLockAtMostFor)
	defer cancel()
	// A job that ignores its context keeps its lock past LockAtMostFor (runs
	// never overlap): say so once, when it happens.
	overrun := context.AfterFunc(capped, func() {
		if errors.Is(context.Cause(capped), ErrLockAtMostFor) {
			j.s.logger.Warn("warden/scheduler: job still running past LockAtMostFor; its context is cancelled and its lock is kept until it returns",
				"job", j.name, "slot", slot, "lock_at_most_for", j.cfg.atMost)
		}
	})
	defer overrun()
	ctx := context.WithValue(capped, runKey{}, &Run{Job: j.name, Slot: slot, Instance: j.s.instance, Lock: l, Term: r.rec.Term})
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrPanicked, r, debug.Stack())
		}
	}()
	return fn(ctx)
}

// release gives the lock up once LockAtLeastFor has passed since it was
// taken, or at once when Stop's bound runs out.
func (r *running) release() {
	j := r.j
	if wait := j.cfg.atLeast - time.Since(r.locked); wait > 0 && r.lock.Err() == nil {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-j.s.hurry:
			t.Stop()
		}
	}
	r.unlock()
}

func (r *running) unlock() {
	if err := r.lock.Unlock(context.WithoutCancel(r.ctx)); err != nil && !errors.Is(err, guard.ErrLockLost) {
		r.j.s.logger.Warn("warden/scheduler: unlock failed", "job", r.j.name, "error", err)
	}
	if r.leave != nil {
		r.leave()
	}
}

// underTerm returns a context of ctx that is also cancelled when term ends,
// with the term's error as its cause, and the function that detaches it.
func underTerm(ctx context.Context, term *guard.Leadership) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(term.Context(), func() { cancel(term.Err()) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// finish records the outcome of a run everywhere.
func (r *running) finish(o Outcome, reason string, err error) {
	j, s, rec := r.j, r.j.s, &r.rec
	if rec.Finished.IsZero() {
		rec.Finished = s.clock()
	}
	rec.Outcome, rec.Reason, rec.Err = o, reason, err
	last := *rec
	j.mu.Lock()
	j.last = &last
	j.mu.Unlock()
	ctx := r.ctx
	s.tel.end(ctx, r.span, rec)
	attrs := []any{"job", rec.Job, "slot", rec.Slot, "instance", rec.Instance, "outcome", o}
	switch o {
	case Ran:
		s.logger.DebugContext(ctx, "warden/scheduler: ran", append(attrs, "token", rec.Token, "took", rec.Finished.Sub(rec.Started))...)
	case Skipped:
		// Every replica but one skips every slot: that is the normal case,
		// not news.
		s.logger.DebugContext(ctx, "warden/scheduler: skipped", append(attrs, "reason", reason)...)
	default:
		s.logger.WarnContext(ctx, "warden/scheduler: run did not succeed", append(attrs, "token", rec.Token, "reason", reason, "error", err)...)
	}
	if reason != "" && o == Ran {
		s.logger.WarnContext(ctx, "warden/scheduler: run overran", append(attrs, "reason", reason)...)
		s.tel.overruns.Add(ctx, 1, metric.WithAttributes(attribute.String("warden.job", rec.Job)))
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
	// held says who has the slot when it could not be claimed, and running
	// whether that one has not finished it.
	held    string
	running bool
	// caughtUp says whose lapsed claim this one replaces (CatchUp).
	caughtUp string
	// sent is when the claim was sent: its lease began no earlier.
	sent time.Time
	// stop ends the renewals keep started.
	stop func()
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
	lease, sent := j.claimLease(), time.Now()
	c.sent = sent
	var rec *idempotency.Record
	claim := func(ctx context.Context) (err error) {
		rec, err = store.Claim(ctx, idempotency.Claim{Scope: slotScope, Key: c.key, Owner: c.owner, Lease: lease})
		return err
	}
	giveBack := func(err error) {
		if !errors.Is(err, idempotency.ErrInvalid) {
			c.giveBack(ctx)
		}
	}
	// Stop cuts the claim short (through ctx): the run is not going ahead.
	if err := j.s.bounded(ctx, storeTimeout, claim, giveBack); err != nil {
		if !errors.Is(err, errLeftBehind) {
			j.s.behindDo(func() { giveBack(err) })
		}
		return slotClaim{}, err
	}
	// A record in progress under this claim's own owner is this very claim,
	// sent again by the client library after its answer was lost (go-redis
	// does, after its read timeout), and made by the first sending.
	if rec != nil && !(rec.State == idempotency.StateInProgress && rec.Owner == c.owner) {
		c.owner = ""
		c.held = fmt.Sprintf("slot %s by %s", rec.State, instanceOf(rec.Owner))
		c.running = rec.State == idempotency.StateInProgress
		return c, nil
	}
	if err := answeredInTime(sent, lease); err != nil {
		j.s.behindDo(func() { c.giveBack(ctx) })
		return slotClaim{}, fmt.Errorf("claim: %w", err)
	}
	return c, nil
}

// answeredInTime refuses a claim, or a renewal, whose answer came so late
// (a paused process, a store answering slowly) that less than a third of
// its lease may be left: the next renewal, a third of the lease on, could
// find it lapsed and the slot caught up by another node.
func answeredInTime(sent time.Time, lease time.Duration) error {
	if took := time.Since(sent); took > lease-lease/3 {
		return fmt.Errorf("%w: answered %v after it was sent, too late in its %v lease",
			idempotency.ErrUnavailable, took.Round(time.Millisecond), lease)
	}
	return nil
}

// claimLease is how long a slot claim lives unless renewed. Without
// CatchUp it covers the longest a run can last (the wait for the lock plus
// the cap), so a node that dies mid-run keeps that one slot claimed. With
// CatchUp it is one lock TTL (at least minCatchUpLease), renewed while the
// run goes on, so that a dead runner's claim lapses soon enough for another
// node to catch the slot up.
func (j *job) claimLease() time.Duration {
	if j.cfg.catchUp {
		return max(j.lockTTL(), minCatchUpLease)
	}
	return j.cfg.wait + j.cfg.atMost + claimMargin
}

// minCatchUpLease keeps CatchUp's claims from lapsing under a runner that
// is alive but slow to renew: a store answering late on a loaded machine
// must not make a slot run twice.
const minCatchUpLease = 2 * time.Second

func (j *job) lockTTL() time.Duration {
	if j.cfg.ttl > 0 {
		return j.cfg.ttl
	}
	return j.s.g.TTL()
}

// catchUp watches a slot claimed by a runner that has not finished, until
// the slot is MisfireAfter old, and claims it once the runner's claim has
// lapsed. It returns the claim it got, or c when the slot was finished
// elsewhere, stayed claimed, or Stop came first.
func (j *job) catchUp(ctx context.Context, slot time.Time, c slotClaim) (slotClaim, error) {
	deadline := slot.Add(j.cfg.misfireAfter)
	every := j.claimLease() / 2
	for c.running {
		left := deadline.Sub(j.s.clock())
		if left <= 0 {
			return c, nil
		}
		t := time.NewTimer(min(every, left))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return c, nil
		}
		next, err := j.claim(ctx, slot)
		if err != nil {
			return c, err
		}
		if next.held == "" {
			next.caughtUp = c.held
		}
		c = next
	}
	return c, nil
}

// keep renews c every third of its lease, when CatchUp makes claims short,
// until the claim is completed or abandoned.
func (c *slotClaim) keep(ctx context.Context) {
	if c.owner == "" || !c.j.cfg.catchUp {
		return
	}
	s, lease := c.j.s, c.j.claimLease()
	// A renewal may outlive stop (bounded leaves a call that does not
	// answer in time behind), and drop clears c.owner: the renewals keep
	// their own copy.
	key, owner := c.key, c.owner
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	// Each renewal is bounded (Scheduler.bounded): the run's end, which
	// stops them, waits for none stuck in a store that hangs; Stop waits
	// for the renewals within its bound.
	s.behind.Add(1)
	go func() {
		defer s.behind.Done()
		defer close(done)
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := s.bounded(ctx, lease/3, func(ctx context.Context) error {
				return s.store.Extend(ctx, slotScope, key, owner, lease)
			}, nil)
			if err != nil && ctx.Err() == nil {
				s.logger.WarnContext(ctx, "warden/scheduler: could not renew the slot claim; once it lapses the slot may be caught up elsewhere after this run",
					"job", c.j.name, "slot", key, "error", err)
			}
		}
	}()
	c.stop = func() {
		cancel()
		select {
		case <-done:
		case <-s.hurry:
		}
	}
}

// confirm renews c, owner-checked, and returns ErrNotOwner when c is no
// longer this run's: its lease ran out (the store does not revive it) and
// another node may have claimed the slot since. A renewal answered too late
// is refused as a claim would be. A claim sent less than a third of its
// lease ago by both the monotonic and the wall clock (a machine's
// suspension moves only the second) cannot have run out: the usual run,
// which takes its lock at once, pays no renewal.
func (c *slotClaim) confirm(ctx context.Context) error {
	if c.owner == "" {
		return nil
	}
	lease := c.j.claimLease()
	if max(time.Since(c.sent), time.Now().Round(0).Sub(c.sent.Round(0))) < lease/3 {
		return nil
	}
	sent := time.Now()
	extend := func(ctx context.Context) error { return c.j.s.store.Extend(ctx, slotScope, c.key, c.owner, lease) }
	if err := c.j.s.bounded(ctx, min(lease/3, storeTimeout), extend, nil); err != nil {
		return err
	}
	return answeredInTime(sent, lease)
}

// drop forgets c, which is no longer this run's, without a word to the
// store.
func (c *slotClaim) drop() {
	if c.stop != nil {
		c.stop()
	}
	c.owner = ""
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
	if c.stop != nil {
		c.stop()
	}
	ctx = context.WithoutCancel(ctx)
	failed := func(err error) {
		if err != nil {
			c.j.s.logger.WarnContext(ctx, "warden/scheduler: could not mark the slot done; it may run again elsewhere once its claim expires",
				"job", c.j.name, "slot", c.key, "error", err)
		}
	}
	complete := func(ctx context.Context) error {
		return c.j.s.store.Complete(ctx, slotScope, c.key, c.owner, []byte(result), c.j.cfg.retention)
	}
	if err := c.j.s.bounded(ctx, storeTimeout, complete, failed); !errors.Is(err, errLeftBehind) {
		failed(err)
	}
}

// giveBack abandons c, whose Claim failed, in case the store made it all
// the same: Stop may have cancelled the call after it went, or its answer
// may have been lost. Left alone, such a claim would keep the slot in
// progress for every node until its lease ran out (without CatchUp, the
// wait for the lock plus LockAtMostFor plus a margin), so that another
// node's late timer, RetryFailedSlots or CatchUp could not run it. The
// claim may land after the failed call has returned (a statement still
// running), hence a few tries over about a second. Abandon is owner-checked
// and the owner is c's own, so nobody else's claim can be freed; a claim
// that was never made costs a few ErrNotOwner answers, on the failure path
// only. It runs behind the run (Scheduler.behindDo, or bounded's after).
func (c slotClaim) giveBack(ctx context.Context) {
	for _, pause := range [...]time.Duration{0, 100 * time.Millisecond, 900 * time.Millisecond} {
		time.Sleep(pause)
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
		err := c.j.s.store.Abandon(actx, slotScope, c.key, c.owner)
		cancel()
		if err == nil {
			c.j.s.logger.InfoContext(ctx, "warden/scheduler: gave back a slot claim whose answer was lost",
				"job", c.j.name, "slot", c.key)
			return
		}
	}
}

// giveBackTimeout bounds each of giveBack's tries: a store that cannot
// answer one in a second is in an outage, and the claim's lease ends it.
const giveBackTimeout = time.Second

func (c slotClaim) abandon(ctx context.Context) {
	if c.owner == "" {
		return
	}
	if c.stop != nil {
		c.stop()
	}
	ctx = context.WithoutCancel(ctx)
	failed := func(err error) {
		if err != nil {
			c.j.s.logger.WarnContext(ctx, "warden/scheduler: could not give the slot back", "job", c.j.name, "slot", c.key, "error", err)
		}
	}
	abandon := func(ctx context.Context) error { return c.j.s.store.Abandon(ctx, slotScope, c.key, c.owner) }
	if err := c.j.s.bounded(ctx, storeTimeout, abandon, failed); !errors.Is(err, errLeftBehind) {
		failed(err)
	}
}

package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
	"go.opentelemetry.io/otel"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
)

// Sentinel errors, for errors.Is.
var (
	// ErrLockAtMostFor is the cause of a job context cancelled because the
	// run reached its LockAtMostFor cap.
	ErrLockAtMostFor = errors.New("warden/scheduler: run reached LockAtMostFor")
	// ErrStopped is the cause of a job context cancelled by Stop.
	ErrStopped = errors.New("warden/scheduler: scheduler stopped")
	// ErrPanicked wraps the value a job panicked with.
	ErrPanicked = errors.New("warden/scheduler: job panicked")
	// ErrExited is the error of a run whose job neither returned nor
	// panicked: it called runtime.Goexit.
	ErrExited = errors.New("warden/scheduler: job exited without returning (runtime.Goexit)")
	// ErrDuplicateJob: a job of that name was already added.
	ErrDuplicateJob = errors.New("warden/scheduler: duplicate job name")
	// ErrInvalidJob: the spec, name or options of a job are unusable.
	ErrInvalidJob = errors.New("warden/scheduler: invalid job")
)

// slotScope is the idempotency scope slots are claimed under, in the
// namespace no request's scope takes (see idempotency.ReservedScopePrefix).
const slotScope = idempotency.ReservedScopePrefix + "scheduler"

// Scheduler runs cron jobs once per slot across every Scheduler sharing its
// lock backend and slot store. Create it with New, add jobs, Start it once
// and Stop it once.
type Scheduler struct {
	g        *guard.Guard
	cron     *cron.Cron
	parser   cron.Parser
	store    idempotency.Store
	clock    func() time.Time
	anchor   time.Time
	location *time.Location
	instance string
	logger   *slog.Logger
	tel      *telemetry
	observer func(RunRecord)
	defaults []JobOption
	cand     *candidate // WithLeaderElection

	// ctx is the parent of every job context; Stop cancels it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// hurry is closed by Stop: locks kept for LockAtLeastFor are then
	// released at once.
	hurry     chan struct{}
	hurryOnce sync.Once

	mu      sync.Mutex
	names   map[string]bool
	jobs    []*job // in the order they were added
	started bool
	stopped bool
	runs    sync.WaitGroup

	// behind counts the store calls a run stopped waiting for (see
	// bounded), and the give-backs of claims whose answer was lost, which
	// go on on their own goroutines; Stop waits for them within a bound.
	// spare holds a token for each more that may be left behind at once.
	behind sync.WaitGroup
	spare  chan struct{}
}

// New returns a Scheduler whose jobs run under g's locks.
func New(g *guard.Guard, opts ...Option) (*Scheduler, error) {
	if g == nil {
		return nil, fmt.Errorf("%w: scheduler: nil Guard", guard.ErrInvalidOption)
	}
	c := config{clock: time.Now, anchor: time.Unix(0, 0), location: time.Local}
	if err := c.apply(opts); err != nil {
		return nil, err
	}
	if c.clock == nil || c.location == nil {
		return nil, fmt.Errorf("%w: scheduler: nil clock or location", guard.ErrInvalidOption)
	}
	if c.instance == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "unknown"
		}
		c.instance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	// Unless told otherwise, a Scheduler logs, traces and measures where its
	// Guard does.
	if c.logger == nil {
		c.logger = g.Logger()
	}
	if c.tracerProvider == nil {
		c.tracerProvider = g.TracerProvider()
	}
	if c.meterProvider == nil {
		c.meterProvider = g.MeterProvider()
	}
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	tel, err := newTelemetry(c.tracerProvider, c.meterProvider)
	if err != nil {
		return nil, fmt.Errorf("warden/scheduler: telemetry: %w", err)
	}
	parser := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	s := &Scheduler{
		g:        g,
		parser:   parser,
		store:    c.store,
		clock:    c.clock,
		anchor:   c.anchor,
		location: c.location,
		instance: c.instance,
		logger:   c.logger,
		tel:      tel,
		observer: c.observer,
		defaults: c.jobDefaults,
		hurry:    make(chan struct{}),
		spare:    make(chan struct{}, maxBehind),
		names:    make(map[string]bool),
	}
	if c.electionSet {
		if s.cand, err = newCandidate(g, c.election, c.logger); err != nil {
			return nil, err
		}
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	s.cron = cron.New(cron.WithParser(parser), cron.WithLocation(c.location), cron.WithLogger(cronLogger{c.logger}))
	return s, nil
}

// Instance returns the name this Scheduler records its runs under.
func (s *Scheduler) Instance() string { return s.instance }

// Add schedules fn under name, which is also the name of its lock and of
// its slots. spec is a cron spec with an optional leading seconds field
// ("*/5 * * * * *", "0 3 * * *"), a descriptor ("@hourly") or "@every D".
// Every node must add the job with the same name and spec, read in the
// same time zone: a spec without CRON_TZ= is read in WithLocation's zone,
// time.Local by default, and "0 3 * * *" on a node run with TZ=UTC and on
// one run with TZ=Europe/Berlin names two instants, so two slots, and the
// job runs at both. The lock is the Scheduler's Guard's, and its name is
// shared with every other lock taken on that Guard: one taken under the
// job's name elsewhere (an httpmw.Lock key made from a request) makes the
// job skip its slots while it is held.
func (s *Scheduler) Add(spec, name string, fn func(ctx context.Context) error, opts ...JobOption) error {
	if fn == nil {
		return fmt.Errorf("%w: %q: nil func", ErrInvalidJob, name)
	}
	j, sched, err := s.specJob(spec, name, opts)
	if err != nil {
		return err
	}
	j.fn, j.slots = fn, newSlotSchedule(sched, s.anchor, s.clock)
	j.slots.passedOver = j.passedOver

	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return fmt.Errorf("%w: add %q", ErrStopped, name)
	}
	if err := s.register(j); err != nil {
		return err
	}
	s.cron.Schedule(j.slots, j)
	return nil
}

// specJob parses spec and returns the job named name that runs on it, its
// options checked, not yet scheduled.
func (s *Scheduler) specJob(spec, name string, opts []JobOption) (*job, cron.Schedule, error) {
	sched, err := parseSpec(s.parser, spec)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %q: %w", ErrInvalidJob, name, err)
	}
	// A day that does not exist ("0 0 30 2 *", April 31) parses, and
	// robfig/cron never fires it, without a word: a slip, refused here
	// rather than a job that silently never runs.
	if sched.Next(s.clock()).IsZero() {
		return nil, nil, fmt.Errorf("%w: %q: spec %q never fires", ErrInvalidJob, name, spec)
	}
	j, err := s.newJob(name, shortestInterval(sched), opts)
	if err != nil {
		return nil, nil, err
	}
	j.spec = spec
	return j, sched, nil
}

// newJob checks a job's name and options and returns the job, not yet
// scheduled. interval is the shortest time between two of its slots, or 0
// when the caller's own scheduler decides (Wrap, Locker).
func (s *Scheduler) newJob(name string, interval time.Duration, opts []JobOption) (*job, error) {
	if err := guard.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("%w: name %q: %w", ErrInvalidJob, name, err)
	}
	// guard.Guard.Campaign holds the lock "election:" + election: a job of
	// that name would find its lock always held by its own leader's term,
	// and be skipped at every slot.
	if s.cand != nil && name == "election:"+s.cand.election {
		return nil, fmt.Errorf("%w: name %q is the lock of the leader election %q", ErrInvalidJob, name, s.cand.election)
	}
	// The slot key is name@RFC3339Nano, which must fit the store's limit.
	if len(name)+1+len("2006-01-02T15:04:05.999999999Z") > idempotency.MaxKeyLen {
		return nil, fmt.Errorf("%w: name %q is too long to name its slots", ErrInvalidJob, name)
	}
	jc := jobConfig{atMost: time.Hour, retention: 24 * time.Hour}
	if err := jc.apply(append(s.defaults[:len(s.defaults):len(s.defaults)], opts...)); err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInvalidJob, name, err)
	}
	if !jc.atLeastSet {
		jc.atLeast = s.defaultAtLeast(interval, jc.atMost)
	}
	if err := jc.validate(s.g); err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInvalidJob, name, err)
	}
	// A run holds its lock for LockAtLeastFor from its start: as long as
	// the time to the next slot, it holds it into that slot, which every
	// node then skips as held, at Debug only, one slot in two or more.
	if interval > 0 && jc.atLeast >= interval {
		return nil, fmt.Errorf("%w: %q: LockAtLeastFor %v is not shorter than the %v between two of its slots: each run's hold would skip the slot after it; give a schedule that fires less often",
			ErrInvalidJob, name, jc.atLeast, interval)
	}
	if jc.catchUp && s.store == nil {
		return nil, fmt.Errorf("%w: %q: CatchUp needs a slot store (WithSlotStore)", ErrInvalidJob, name)
	}
	// A claim's lease covers the wait for the lock and the cap on the run
	// (claimLease): a sum past the largest Duration would wrap negative,
	// and the store would refuse every slot's claim.
	if s.store != nil && !jc.catchUp && jc.wait > math.MaxInt64-claimMargin-jc.atMost {
		return nil, fmt.Errorf("%w: %q: WaitForLock %v plus LockAtMostFor %v is too long to lease a slot claim for",
			ErrInvalidJob, name, jc.wait, jc.atMost)
	}
	j := &job{s: s, name: name, cfg: jc}
	// misfireAfter <= 2*lease, written so that a lease past half the
	// largest Duration (LockTTL of centuries) does not wrap 2*lease
	// negative and let through a CatchUp that could never catch up.
	if lease := j.claimLease(); jc.catchUp && lease > (jc.misfireAfter-1)/2 {
		return nil, fmt.Errorf("%w: %q: MisfireAfter %v leaves no time to catch a slot up: a dead runner's claim lapses %v after its last renewal, so it must be more than twice that",
			ErrInvalidJob, name, jc.misfireAfter, lease)
	}
	if jc.ttl > 0 {
		j.lockOpts = append(j.lockOpts, guard.TTL(jc.ttl))
	}
	if jc.wait > 0 {
		j.lockOpts = append(j.lockOpts, guard.WaitAtMost(jc.wait))
	} else {
		j.lockOpts = append(j.lockOpts, guard.NoWait())
	}
	return j, nil
}

// DefaultLockAtLeastFor is how long a job's lock is kept, by default, when
// there is no slot store: it covers nodes whose clocks and timers are up to
// that far apart, so that a short run is not repeated by a node that fires
// a little later for the same slot. With a slot store the store keeps slots
// apart and the default is 0.
const DefaultLockAtLeastFor = time.Second

// defaultAtLeast is the LockAtLeastFor of a job that did not set one: none
// with a slot store; otherwise DefaultLockAtLeastFor, or half the interval
// of a job that fires more often than twice that, so that the hold never
// swallows the job's own next slot. Never more than atMost.
func (s *Scheduler) defaultAtLeast(interval, atMost time.Duration) time.Duration {
	if s.store != nil {
		return 0
	}
	d := DefaultLockAtLeastFor
	if interval > 0 && interval < 2*d {
		d = interval / 2
	}
	return min(d, atMost)
}

// enter counts a run in, unless the Scheduler has stopped.
func (s *Scheduler) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.runs.Add(1)
	return true
}

// Entry describes one job of a Scheduler, as Entries reports it.
type Entry struct {
	// Name is the job's name, which is also its lock's.
	Name string
	// Spec is the schedule it was added with.
	Spec string
	// Next is the job's next slot on the scheduler's clock; zero before
	// Start, after Stop, or when the schedule never fires again.
	Next time.Time
	// Last is this Scheduler's record of the job's latest run (skipped ones
	// included), or nil before the first.
	Last *RunRecord
}

// Entries lists the jobs in the order they were added.
func (s *Scheduler) Entries() []Entry {
	s.mu.Lock()
	jobs := s.jobs[:len(s.jobs):len(s.jobs)]
	running := s.started && !s.stopped
	s.mu.Unlock()
	out := make([]Entry, len(jobs))
	for i, j := range jobs {
		out[i] = Entry{Name: j.name, Spec: j.spec, Last: j.lastRun()}
		if running {
			out[i].Next = j.slots.next()
		}
	}
	return out
}

// Start starts the timer loop. Jobs added later are scheduled as they come.
// Starting twice, or after Stop, does nothing.
func (s *Scheduler) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return
	}
	s.started = true
	if s.cand != nil {
		s.runs.Add(1)
		go func() {
			defer s.runs.Done()
			s.cand.run(s.ctx)
		}()
	}
	s.cron.Start()
}

// Stop stops scheduling, cancels the contexts of running jobs (cause
// ErrStopped), releases the locks kept for LockAtLeastFor at once, resigns
// any leadership (WithLeaderElection, Elector), and waits for the jobs to
// return and release their locks. When ctx is done first, Stop waits at
// most the Guard's ReleaseTimeout more, for jobs that returned as it
// ended to release their locks, and returns ctx's error unless every job
// has returned by then: a job that ignores its context holds Stop for
// ctx's time and that grace, not longer.
//
// Stop does not wait for the slot store beyond a bound, whatever its client
// does with contexts: the runs stop waiting for their store calls, and the
// calls left going on (a slot being completed, a claim given back) are
// waited for at most the Guard's ReleaseTimeout once the jobs have
// returned.
//
// Releasing a LockAtLeastFor hold early is safe here: the hold guards
// against a node whose clock is behind running the same slot again, and
// with a slot store the slot is already recorded as done.
//
// A job that stops its own Scheduler must not wait for Stop: Stop waits for
// that job, so Stop(context.Background()) called from a job never returns.
// Call it on a goroutine of its own (go s.Stop(ctx)), which returns once
// the job has. Stop cannot tell that it is called from a job: Go has no
// goroutine identity, and the ctx it is given need not be the job's.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	// robfig's Stop context would wait for the runs, which wait for the
	// cancellation below: only the timer loop is stopped here, and the runs
	// are waited for through s.runs, which no run joins once stopped is set.
	s.cron.Stop()
	s.cancel(ErrStopped)
	s.hurryOnce.Do(func() { close(s.hurry) })

	done := make(chan struct{})
	go func() {
		s.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
		t := time.NewTimer(s.g.ReleaseTimeout())
		defer t.Stop()
		s.waitBehind(t.C)
		return nil
	case <-ctx.Done():
	}
	// The held locks are being released now; give that the Guard's own
	// release bound rather than none. A ctx done before the call (or as
	// the runs ended) must not make a Stop whose runs all ended report
	// that they did not.
	t := time.NewTimer(s.g.ReleaseTimeout())
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return ctx.Err()
	}
	// Every run ended: their store calls left behind get what is left of
	// the same grace, and Stop reports what it reports when ctx did not
	// end, that the jobs returned.
	s.waitBehind(t.C)
	return nil
}

// waitBehind waits for the store calls the runs left behind (a slot
// completed as Stop came, a claim given back) until expired, which Stop
// gives the Guard's release bound: a healthy store answers them well
// within it, and a hung one must not hold Stop for as long as its client
// library waits.
func (s *Scheduler) waitBehind(expired <-chan time.Time) {
	done := make(chan struct{})
	go func() {
		s.behind.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-expired:
	}
}

// maxBehind bounds the store calls left to finish on their own at once
// (calls no longer waited for, and give-backs): once that many are left, a
// store is taken for down, and a run's next call fails at once rather than
// pile up another goroutine or wait as long as the client library does.
// Calls answered in time hold no room, so many jobs due at once on a
// healthy store are not refused.
const maxBehind = 64

// bounded makes the store call f, bounded by timeout, and waits for its
// answer until ctx is done, timeout passes or Stop is called, whichever
// comes first. Not every client library
// heeds ctx: go-redis without ContextTimeoutEnabled waits out its read
// timeout and then retries, so that a hung server held a run, and Stop,
// for 20 s. A call no longer waited for goes on on its own goroutine and
// then hands its error to after, when after is not nil.
func (s *Scheduler) bounded(ctx context.Context, timeout time.Duration, f func(context.Context) error, after func(error)) error {
	if len(s.spare) == cap(s.spare) {
		return fmt.Errorf("%w: %d slot store calls are still unanswered", idempotency.ErrUnavailable, maxBehind)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	answer := make(chan error, 1)
	// waited: 0 the answer was taken; 1 left behind holding a token of
	// spare; 2 left behind without one (spare filled meanwhile).
	waited := make(chan int, 1)
	s.behind.Add(1)
	go func() {
		defer s.behind.Done()
		defer cancel()
		err := f(ctx)
		answer <- err
		if w := <-waited; w != 0 {
			if w == 1 {
				<-s.spare
			}
			if after != nil {
				after(err)
			}
		}
	}()
	select {
	case err := <-answer:
		waited <- 0
		return err
	case <-ctx.Done():
	case <-s.hurry:
	}
	select {
	case err := <-answer:
		waited <- 0
		return err
	default:
	}
	// Left behind: it holds a token until it ends.
	select {
	case s.spare <- struct{}{}:
		waited <- 1
	default:
		waited <- 2
	}
	return fmt.Errorf("%w: %w before %v", idempotency.ErrUnavailable, errLeftBehind, cmp.Or(context.Cause(ctx), ErrStopped))
}

// errLeftBehind: a store call was not waited for (see bounded); its own
// ending is handled where it ends.
var errLeftBehind = errors.New("no answer from the slot store")

// behindDo runs f on a goroutine of its own that Stop waits for only within
// its bound, or not at all when maxBehind are running already.
func (s *Scheduler) behindDo(f func()) {
	select {
	case s.spare <- struct{}{}:
	default:
		return
	}
	s.behind.Add(1)
	go func() {
		defer s.behind.Done()
		defer func() { <-s.spare }()
		f()
	}()
}

// cronLogger sends robfig/cron's errors to slog; its chatty info lines
// (every wake-up) are dropped.
type cronLogger struct{ l *slog.Logger }

func (c cronLogger) Info(string, ...any) {}

func (c cronLogger) Error(err error, msg string, kv ...any) {
	c.l.Error("warden/scheduler: cron: "+msg, append([]any{"error", err}, kv...)...)
}

package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// ErrDuplicateJob: a job of that name was already added.
	ErrDuplicateJob = errors.New("warden/scheduler: duplicate job name")
	// ErrInvalidJob: the spec, name or options of a job are unusable.
	ErrInvalidJob = errors.New("warden/scheduler: invalid job")
)

// slotScope is the idempotency scope slots are claimed under.
const slotScope = "warden.scheduler"

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
	instance string
	logger   *slog.Logger
	tel      *telemetry
	observer func(RunRecord)
	defaults []JobOption

	// ctx is the parent of every job context; Stop cancels it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// hurry is closed when Stop's context is done: locks kept for
	// LockAtLeastFor are then released at once.
	hurry     chan struct{}
	hurryOnce sync.Once

	mu      sync.Mutex
	names   map[string]bool
	started bool
	stopped bool
	runs    sync.WaitGroup
}

// New returns a Scheduler whose jobs run under g's locks.
func New(g *guard.Guard, opts ...Option) (*Scheduler, error) {
	if g == nil {
		return nil, fmt.Errorf("%w: nil Guard", guard.ErrInvalidOption)
	}
	c := config{clock: time.Now, anchor: time.Unix(0, 0), location: time.Local}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.clock == nil || c.location == nil {
		return nil, fmt.Errorf("%w: nil clock or location", guard.ErrInvalidOption)
	}
	if c.instance == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "unknown"
		}
		c.instance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
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
		instance: c.instance,
		logger:   c.logger,
		tel:      tel,
		observer: c.observer,
		defaults: c.jobDefaults,
		hurry:    make(chan struct{}),
		names:    make(map[string]bool),
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
// Every node must add the job with the same name and spec.
func (s *Scheduler) Add(spec, name string, fn func(ctx context.Context) error, opts ...JobOption) error {
	if fn == nil {
		return fmt.Errorf("%w: %q: nil func", ErrInvalidJob, name)
	}
	if err := guard.ValidateKey(name); err != nil {
		return fmt.Errorf("%w: name %q: %w", ErrInvalidJob, name, err)
	}
	// The slot key is name@RFC3339Nano, which must fit the store's limit.
	if len(name)+1+len("2006-01-02T15:04:05.999999999Z") > idempotency.MaxKeyLen {
		return fmt.Errorf("%w: name %q is too long to name its slots", ErrInvalidJob, name)
	}
	jc := jobConfig{atMost: time.Hour, retention: 24 * time.Hour}
	for _, o := range append(s.defaults[:len(s.defaults):len(s.defaults)], opts...) {
		if o != nil {
			o(&jc)
		}
	}
	if jc.atMost <= 0 || jc.atLeast < 0 || jc.wait < 0 || jc.misfireAfter < 0 || jc.ttl < 0 || jc.retention <= 0 {
		return fmt.Errorf("%w: %q: negative or zero bound", ErrInvalidJob, name)
	}
	sched, err := s.parser.Parse(spec)
	if err != nil {
		return fmt.Errorf("%w: %q: spec %q: %w", ErrInvalidJob, name, spec, err)
	}
	j := &job{s: s, name: name, fn: fn, cfg: jc, slots: newSlotSchedule(sched, s.anchor, s.clock)}
	if jc.ttl > 0 {
		j.lockOpts = append(j.lockOpts, guard.TTL(jc.ttl))
	}
	if jc.wait > 0 {
		j.lockOpts = append(j.lockOpts, guard.WaitAtMost(jc.wait))
	} else {
		j.lockOpts = append(j.lockOpts, guard.NoWait())
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.names[name] {
		return fmt.Errorf("%w: %q", ErrDuplicateJob, name)
	}
	if s.stopped {
		return fmt.Errorf("%w: add %q", ErrStopped, name)
	}
	s.names[name] = true
	s.cron.Schedule(j.slots, j)
	return nil
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
	s.cron.Start()
}

// Stop stops scheduling, cancels the contexts of running jobs (cause
// ErrStopped) and waits for them to return and release their locks. Locks
// kept for LockAtLeastFor are held until that time unless ctx is done
// first, in which case they are released at once. Stop returns ctx's error
// if ctx is done before every job has returned.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	// robfig's Stop context would wait for the runs, which wait for the
	// cancellation below: only the timer loop is stopped here, and the runs
	// are waited for through s.runs, which no run joins once stopped is set.
	s.cron.Stop()
	s.cancel(ErrStopped)

	done := make(chan struct{})
	go func() {
		s.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.hurryOnce.Do(func() { close(s.hurry) })
	}
	// The held locks are being released now; give that the Guard's own
	// release bound rather than none.
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	return ctx.Err()
}

// cronLogger sends robfig/cron's errors to slog; its chatty info lines
// (every wake-up) are dropped.
type cronLogger struct{ l *slog.Logger }

func (c cronLogger) Info(string, ...any) {}

func (c cronLogger) Error(err error, msg string, kv ...any) {
	c.l.Error("warden/scheduler: cron: "+msg, append([]any{"error", err}, kv...)...)
}

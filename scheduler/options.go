package scheduler

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
)

// Option configures a Scheduler.
type Option func(*config)

type config struct {
	store          idempotency.Store
	clock          func() time.Time
	anchor         time.Time
	instance       string
	location       *time.Location
	logger         *slog.Logger
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	observer       func(RunRecord)
	jobDefaults    []JobOption
	election       string
	electionSet    bool
	// err is the first option New must refuse: options cannot return one.
	err error
}

// refuse records the first invalid option, which New then returns.
func (c *config) refuse(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: scheduler: "+format, append([]any{guard.ErrInvalidOption}, args...)...)
	}
}

// apply applies opts to c and returns the first refusal, naming a nil
// option by its place.
func (c *config) apply(opts []Option) error {
	for i, o := range opts {
		if o == nil {
			return fmt.Errorf("%w: scheduler: nil Option (argument %d)", guard.ErrInvalidOption, i)
		}
		o(c)
	}
	return c.err
}

// WithSlotStore sets the idempotency store in which each slot is claimed, so
// that a slot runs at most once across every Scheduler sharing the store,
// whatever their clocks say. Without one, once per slot rests on the lock
// and LockAtLeastFor alone (see the package documentation).
// A nil store is refused: leave the option out to run without one.
//
// A slot is claimed by its job's name and time alone, not by the Guard's
// prefix: two services whose jobs share a name and a store (one Redis for
// both) claim each other's slots, and each slot runs in one of them only.
// Give each service a store of its own (on Redis,
// redislock.WithStorePrefix), or jobs of names of its own.
func WithSlotStore(s idempotency.Store) Option {
	return func(c *config) {
		if s == nil {
			c.refuse("nil WithSlotStore")
		}
		c.store = s
	}
}

// WithClock sets the clock slots and misfires are computed on (default
// time.Now). It exists for tests that give one node a skewed clock; the
// locks and the slot store never use it, since their time is the servers'.
func WithClock(now func() time.Time) Option {
	return func(c *config) {
		if now == nil {
			c.refuse("nil WithClock")
		}
		c.clock = now
	}
}

// WithAnchor sets the instant @every schedules are aligned to (default the
// Unix epoch): the slots of "@every D" are anchor + k*D on every node.
func WithAnchor(t time.Time) Option { return func(c *config) { c.anchor = t } }

// WithInstance names this scheduler in spans, logs and RunRecords (default
// host-pid).
func WithInstance(name string) Option { return func(c *config) { c.instance = name } }

// WithLocation sets the time zone cron specs are read in (default
// time.Local). A spec may also name its own with CRON_TZ=. time.Local is
// each process's own (its TZ, its image's /etc/localtime): where nodes may
// differ, set the zone here or in the spec, since nodes that read a spec in
// different zones fire it at different instants, each a slot of its own.
func WithLocation(loc *time.Location) Option {
	return func(c *config) {
		if loc == nil {
			c.refuse("nil WithLocation")
		}
		c.location = loc
	}
}

// WithLogger sets the logger for run outcomes and robfig/cron's own errors
// (default the Guard's).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.refuse("nil WithLogger")
		}
		c.logger = l
	}
}

// WithTracerProvider sets where run spans go (default the Guard's).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp == nil {
			c.refuse("nil WithTracerProvider")
		}
		c.tracerProvider = tp
	}
}

// WithMeterProvider sets where run metrics go (default the Guard's).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) {
		if mp == nil {
			c.refuse("nil WithMeterProvider")
		}
		c.meterProvider = mp
	}
}

// WithRunObserver calls fn once for every run, whatever its outcome, after
// the job returned (or was skipped). fn runs on the run's goroutine; keep it
// short. It is the hook to record job runs in an application's database.
func WithRunObserver(fn func(RunRecord)) Option {
	return func(c *config) {
		if fn == nil {
			c.refuse("nil WithRunObserver")
		}
		c.observer = fn
	}
}

// WithJobDefaults sets options applied to every job before its own.
func WithJobDefaults(opts ...JobOption) Option {
	return func(c *config) {
		for i, o := range opts {
			if o == nil {
				c.refuse("nil JobOption (argument %d of WithJobDefaults)", i)
			}
		}
		c.jobDefaults = append(c.jobDefaults, opts...)
	}
}

// JobOption configures one job.
type JobOption func(*jobConfig)

type jobConfig struct {
	atMost       time.Duration
	atLeast      time.Duration
	atLeastSet   bool
	wait         time.Duration
	misfireAfter time.Duration
	ttl          time.Duration
	retention    time.Duration
	retryFailed  bool
	catchUp      bool
}

// LockAtMostFor is the hard cap on a run (default one hour): when it passes,
// the job's context is cancelled with cause ErrLockAtMostFor, however well
// the lease keeper keeps the lock alive, and a warning names the job. The
// lock itself is held until the job returns, so that two runs never
// overlap: a job must honour its context.
//
// Coming from ShedLock: there lockAtMostFor is also how long the lock of a
// dead node lasts. Here that is the lock's TTL (guard.WithTTL, LockTTL),
// kept short and renewed while the node lives, so a dead node's lock goes
// after one TTL whatever LockAtMostFor says.
func LockAtMostFor(d time.Duration) JobOption { return func(c *jobConfig) { c.atMost = d } }

// LockAtLeastFor keeps the lock for at least d after it was taken, even
// when the run ends sooner, so that a node whose clock or timer is a little
// behind finds it held rather than running the job again. The default is 0
// with a slot store (the store keeps slots apart) and
// DefaultLockAtLeastFor without one (see there). Add and WrapSpec refuse a
// d not shorter than the time between two of the job's slots: each run
// would hold the lock into the next slot, and every node skip it.
func LockAtLeastFor(d time.Duration) JobOption {
	return func(c *jobConfig) { c.atLeast, c.atLeastSet = d, true }
}

// WaitForLock makes a run that finds the lock held wait up to d for it
// instead of being skipped at once.
func WaitForLock(d time.Duration) JobOption { return func(c *jobConfig) { c.wait = d } }

// MisfireAfter skips, with outcome misfired, a run that would start more
// than d after its slot (default: no bound), whether the delay came from a
// late timer or from waiting for the lock.
func MisfireAfter(d time.Duration) JobOption { return func(c *jobConfig) { c.misfireAfter = d } }

// LockTTL sets the lease TTL of the job's lock (default the Guard's). It is
// how long the lock outlives a node that dies mid-run.
func LockTTL(d time.Duration) JobOption { return func(c *jobConfig) { c.ttl = d } }

// SlotRetention is how long a finished slot stays in the slot store
// (default 24 hours); a node whose timer fires later than that for the same
// slot would run it again. With WithLeaderElection and CatchUp it also
// bounds the catch-up: a follower keeps a slot in view for half of it at
// most, so a slot whose leader died later than that into the slot (a run
// longer than half the retention) is not caught up. Keep it above twice
// the longest run and MisfireAfter.
func SlotRetention(d time.Duration) JobOption { return func(c *jobConfig) { c.retention = d } }

// RetryFailedSlots lets a slot whose run failed, panicked or lost its lock
// be run again by a node that fires later for it. By default a failed slot
// is recorded as done and is not retried: the next slot runs as scheduled.
func RetryFailedSlots() JobOption { return func(c *jobConfig) { c.retryFailed = true } }

// CatchUp runs again a slot whose runner died before finishing it: another
// node that found the slot claimed keeps watching the claim until the slot
// is MisfireAfter old, and once the claim has expired (its runner stopped
// renewing it) claims the slot and runs it, waiting for the dead runner's
// lock to expire if need be, with a fresh fencing token. A run that Stop
// cut short (its job did not succeed once Stop had cancelled its context)
// gives its claim back, and is caught up the same way. Off by default:
// a job must be safe to run twice for the slot it was cut short in, since
// the dead run may have done part of its work.
//
// It needs a slot store and a MisfireAfter of more than twice the claim's
// lease, which is the job's lock TTL but at least 2s. While a run goes on,
// its runner renews its claim every third of that lease, so a dead runner's
// claim lapses one lease after its last renewal. A runner that cannot renew
// its claim for a whole TTL (its store unreachable) may see the slot run
// again elsewhere once it has finished: the job's lock keeps the two runs
// from overlapping.
//
// With WithLeaderElection the followers watch no claim: a follower keeps
// each slot in view instead, until it is MisfireAfter old or half its
// SlotRetention old, whichever comes first (the leader's record of a slot
// it finished must still be there when the follower claims it), and should
// it come to lead by then, it claims the slot as a leader does, and runs it
// if nobody finished it: a slot its dead or stopped leader did not finish,
// or one that fell due while no node led. A slot the leader skipped because
// the job's lock was held is recorded as done, and stays skipped. A
// follower keeps the latest 64 slots of a job in view at most, each on a
// goroutine of its own, and lets older ones go. Jobs of Wrap and Locker
// keep none in view: their runs fire in the caller's goroutine, and a
// follower's return at once.
func CatchUp() JobOption { return func(c *jobConfig) { c.catchUp = true } }

// minBound is the shortest non-zero bound a job accepts: anything shorter is
// a unit slip (LockAtMostFor(5) is five nanoseconds).
const minBound = time.Millisecond

// apply applies opts to c, refusing a nil one by its place.
func (c *jobConfig) apply(opts []JobOption) error {
	for i, o := range opts {
		if o == nil {
			return fmt.Errorf("nil JobOption (argument %d, job defaults first)", i)
		}
		o(c)
	}
	return nil
}

// validate refuses bounds that are out of range or contradict each other,
// and a lock TTL the Guard's backend cannot honour.
func (c *jobConfig) validate(g *guard.Guard) error {
	short := func(d time.Duration) bool { return d != 0 && d < minBound }
	switch {
	case c.atMost <= 0:
		return fmt.Errorf("LockAtMostFor %v is not positive", c.atMost)
	case c.atMost < minBound:
		return fmt.Errorf("LockAtMostFor %v is shorter than %v", c.atMost, minBound)
	case c.atLeast < 0:
		return fmt.Errorf("LockAtLeastFor %v is negative", c.atLeast)
	case short(c.atLeast):
		return fmt.Errorf("LockAtLeastFor %v is neither 0 nor at least %v", c.atLeast, minBound)
	case short(c.wait):
		return fmt.Errorf("WaitForLock %v is neither 0 nor at least %v", c.wait, minBound)
	case short(c.misfireAfter):
		return fmt.Errorf("MisfireAfter %v is neither 0 nor at least %v", c.misfireAfter, minBound)
	case c.retention > 0 && c.retention < minBound:
		return fmt.Errorf("SlotRetention %v is shorter than %v", c.retention, minBound)
	case c.atLeast > c.atMost:
		return fmt.Errorf("LockAtLeastFor %v is longer than LockAtMostFor %v", c.atLeast, c.atMost)
	case c.wait < 0:
		return fmt.Errorf("WaitForLock %v is negative", c.wait)
	case c.misfireAfter < 0:
		return fmt.Errorf("MisfireAfter %v is negative", c.misfireAfter)
	case c.retention <= 0:
		return fmt.Errorf("SlotRetention %v is not positive", c.retention)
	case c.ttl < 0:
		return fmt.Errorf("LockTTL %v is negative", c.ttl)
	case short(c.ttl):
		return fmt.Errorf("LockTTL %v is neither 0 (the Guard's) nor at least %v", c.ttl, minBound)
	case c.catchUp && c.misfireAfter == 0:
		return errors.New("CatchUp needs MisfireAfter, the age after which a slot is no longer caught up")
	}
	if c.ttl > 0 {
		if err := g.ValidateTTL(c.ttl); err != nil {
			return fmt.Errorf("LockTTL: %w", err)
		}
	}
	return nil
}

package guard

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Option configures a Guard.
type Option func(*config)

type config struct {
	prefix         string
	ttl            time.Duration
	margin         time.Duration // 0: a tenth of each lock's TTL
	releaseTimeout time.Duration
	callTimeout    time.Duration
	idleCallers    int
	backend        string
	owner          string
	ownerSet       bool
	logger         *slog.Logger
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
}

// WithPrefix namespaces every key: the backend sees prefix+key. Default
// "warden:". Services sharing one backend keep apart by using different
// prefixes.
func WithPrefix(prefix string) Option { return func(c *config) { c.prefix = prefix } }

// WithTTL sets the default lease TTL (default 30s). A held lease is renewed
// every TTL/3, so the TTL only matters when the holder dies or is cut off: it
// is how long the lock stays taken by a crashed process. It must be one the
// backend honours (driver.Limits); New refuses it otherwise.
func WithTTL(ttl time.Duration) Option { return func(c *config) { c.ttl = ttl } }

// WithSafetyMargin sets how long before a lease's conservative expiry the
// critical section's context is cancelled when no renewal has confirmed the
// lease by then (default a tenth of each lock's TTL). It is the time the
// section gets to stop before another process may take the lock, and room
// for the server's clock running slightly faster than this one. It must be
// shorter than half of every TTL used with the Guard.
func WithSafetyMargin(d time.Duration) Option { return func(c *config) { c.margin = d } }

// WithReleaseTimeout bounds the release done on the way out of a critical
// section (default 5s). The release runs on a context detached from the
// caller's, so a cancelled request still unlocks.
func WithReleaseTimeout(d time.Duration) Option { return func(c *config) { c.releaseTimeout = d } }

// WithCallTimeout bounds a call to the backend that its context's deadline
// does not bound sooner (default 5s): the one attempt of TryLock and of Lock
// with NoWait, and Ping, Inspect, List, ForceRelease and Observe's polls. A
// waiting Lock is bounded by its wait bound and its context instead, and a
// release by the release timeout. guard keeps the bound itself, whatever
// the client's own timeouts and retries: see Lock. While 256 calls the
// backend left unanswered are still running, the next fails at once with
// ErrUnavailable, so that a hung backend does not cost a goroutine per call.
func WithCallTimeout(d time.Duration) Option { return func(c *config) { c.callTimeout = d } }

// WithIdleCallers sets how many goroutines the Guard keeps idle, each for
// up to a second, to run the calls it must be able to stop waiting for
// (default 16): to a backend that declares neither driver.ContextBounded
// nor driver.DeadlineBounded, every call whose context can end and every
// release; to a DeadlineBounded one (redislock over a go-redis Client made
// with ContextTimeoutEnabled), only the calls whose context can be
// cancelled, all others running on the caller's goroutine, as does the
// first attempt of a waiting acquisition of a plain lock (not Fair, with
// its bounds 10ms away or more), which does not wait and is bounded by
// 10ms of its own; the wait is handed off when that attempt finds the lock
// held or gets no answer, and then the Guard makes no such attempt for a
// second (longer after attempts in a row that got no answer in time, see
// the redislock README).
// Keeping them spares each such call a goroutine's start and stack growth,
// which cost two fifths of the client's CPU in an uncontended cycle on
// Redis. 0 starts a goroutine per call and keeps none, as a Guard used in
// a testing/synctest bubble needs: a goroutine left idle outlives the
// bubble's test, which then panics, and a Guard used both inside and
// outside a bubble stops the whole test binary with a fatal runtime error
// (its idle goroutines and its timers, the release timer among them,
// belong to the side that made them).
func WithIdleCallers(n int) Option { return func(c *config) { c.idleCallers = n } }

// WithBackendName names the backend in spans, metrics and logs (default: the
// Locker's Go type).
func WithBackendName(name string) Option { return func(c *config) { c.backend = name } }

// WithOwner labels every lease this Guard takes, so that Inspect, Observe
// and operators see who holds a lock (default: the host name and process
// id, "host/pid"). At most driver.MaxOwnerLen bytes of UTF-8 without control
// characters; empty means no label. It never decides ownership: two Guards
// with the same label still exclude each other.
func WithOwner(label string) Option {
	return func(c *config) { c.owner, c.ownerSet = label, true }
}

// WithLogger sets the logger for lock events such as losses and failed
// refreshes (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithTracerProvider sets where spans go, and records a span for every
// acquisition and critical section. Without it, spans go where a recording
// parent span's go (a traced request or job), else to the global
// TracerProvider once the program has set one (otel.SetTracerProvider), as
// in the scheduler and httpmw; a program that traces nothing pays nothing
// for them.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithMeterProvider sets where metrics go (default the otel global provider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// LockOption configures one acquisition.
type LockOption func(*lockConfig)

type mode uint8

const (
	exclusive mode = iota
	read
	write
	semaphore
)

func (m mode) String() string {
	switch m {
	case read:
		return "read"
	case write:
		return "write"
	case semaphore:
		return "semaphore"
	}
	return "exclusive"
}

type lockConfig struct {
	ttl     time.Duration
	wait    time.Duration // <0: until ctx is done; 0: one attempt; >0: at most this long
	fair    bool
	mode    mode
	permits int
	// detach: the lock's context keeps the caller's values but not its
	// cancellation, which then bounds only the wait (Campaign).
	detach bool
}

// TTL overrides the Guard's lease TTL for this lock. It must be one the
// backend honours, and longer than twice the Guard's safety margin.
func TTL(ttl time.Duration) LockOption { return func(c *lockConfig) { c.ttl = ttl } }

// WaitAtMost bounds how long Lock and Do wait for a held lock; when the bound
// runs out they return ErrNotAcquired (or ErrUnavailable when the backend
// could not be reached). Without it they wait until the context is done. A
// bound of 0 or less means no wait, as NoWait: a deadline computed with
// time.Until that has already passed makes one attempt, never an endless
// wait.
func WaitAtMost(d time.Duration) LockOption { return func(c *lockConfig) { c.wait = max(d, 0) } }

// NoWait makes Lock and Do give up at once, with ErrNotAcquired, when the
// lock is held: the behaviour of TryLock.
func NoWait() LockOption { return func(c *lockConfig) { c.wait = 0 } }

// Fair asks for first-come, first-served handoff among waiters. Backends that
// cannot honour it fail the acquisition with ErrUnsupported.
func Fair() LockOption { return func(c *lockConfig) { c.fair = true } }

// Read takes the shared side of a read/write lock: many readers may hold the
// key at once, but no writer. Needs a backend implementing
// driver.RWLocker (every one but redlock and sqllock); on another, the
// acquisition fails with ErrUnsupported.
func Read() LockOption { return func(c *lockConfig) { c.mode = read } }

// Write takes the exclusive side of a read/write lock. Needs a backend
// implementing driver.RWLocker, as Read does.
//
// Whether a plain lock, a read/write lock and a semaphore on the same key
// exclude one another depends on the backend: on Redis, Consul and the
// in-process backend they are different locks; on ZooKeeper a writer is the
// plain lock, and semaphores are apart; on etcd a semaphore held first keeps
// out every other kind, while a plain lock, a reader or a writer held first
// takes one of a later semaphore's permits. Take one kind per key, so that
// changing backends changes nothing. A context that holds a key is refused
// another kind on it (ErrInvalidOption), which could wait for its own hold,
// but a Read within a Write returns the write lock.
func Write() LockOption { return func(c *lockConfig) { c.mode = write } }

// Permits turns the lock into a counting semaphore: up to n holders at once.
// Needs a backend implementing driver.Semaphorer (every one but redlock
// and sqllock; on another, the acquisition fails with ErrUnsupported). A
// semaphore and a lock of another kind on the same key may or may not
// exclude each other: see Write.
func Permits(n int) LockOption {
	return func(c *lockConfig) { c.mode, c.permits = semaphore, n }
}

func (c *lockConfig) validate() error {
	if c.mode == semaphore && c.permits < 1 {
		return fmt.Errorf("%w: %d permits, want at least 1", ErrInvalidOption, c.permits)
	}
	return nil
}

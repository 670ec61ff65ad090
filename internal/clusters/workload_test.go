//go:build clusters

package clusters

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

const (
	contenders = 4
	// hold is each of the two pauses of a section, before each write: long
	// enough that a holder that lost its lock without knowing still writes
	// after the next holder started, short enough for many cycles.
	hold = 10 * time.Millisecond
	// stopWithin bounds how long a worker may take to return once told to
	// stop: a release bounded by guard's 5s release timeout, and the
	// backend's own request timeouts, fit well within it.
	stopWithin = 15 * time.Second
	// settleGrants is how many grants after a fault show that the lock works
	// again before the next fault.
	settleGrants = 10
)

// runID keeps the keys of one run apart from those of earlier runs, whose
// leftovers would otherwise be judged as this run's.
var runID = strconv.FormatInt(time.Now().UnixNano(), 36)

// prefixOf is the guard prefix of scenario name's keys.
func prefixOf(name string) string { return "wc-" + runID + ":" + name + ":" }

// contender is one client of the lock: its own connection, Locker and
// Guard, as a separate process would have.
type contender struct {
	locker driver.Locker
	close  func() error // closes the Locker, then the connection
	// every, when set, makes the client ask for the lock once per period,
	// at the period's ticks on the wall clock, so that every client asks
	// at the same moment, as a job scheduled on every process does: all
	// but one then wait, and each handoff rests on the release waking the
	// next waiter, as no newcomer comes to take a lock left free. Without
	// it, a client asks again as soon as its section is over.
	every time.Duration
}

type worker struct {
	id      int
	g       *guard.Guard
	close   func() error
	done    chan struct{}
	stopped time.Time
	every   time.Duration
	// releaseFailed is set by the worker's Guard logger when a release was
	// refused, leaving the lease on the server until it runs out.
	releaseFailed atomic.Bool
}

// scenario is the workload of one test: contenders looping on one key,
// the faults injected meanwhile, and what the workers saw.
type scenario struct {
	t      *testing.T
	name   string
	prefix string // guard's prefix; the backend sees prefix+key
	key    string
	ttl    time.Duration
	opts   []guard.LockOption // of every acquisition
	store  fencedCounter
	cancel context.CancelFunc
	start  time.Time

	workers []*worker
	logs    *warnCounter
	// judgeFree makes the longest time a waiting worker saw the key free
	// a judged row (freeBound); otherwise it is only reported.
	judgeFree bool
	// electionBound: the lock must come back within a second of the
	// cluster serving again, not within its TTL, because no fault cuts a
	// holder off from the cluster for longer than that (Consul's clients
	// talk to an agent that the faults spare).
	electionBound bool
	// diagnose describes the servers' state (who holds, who waits) when
	// the lock does not come back in time, for the report of the stall.
	diagnose func() string
	// watching is closed when watchStalls has returned.
	watching chan struct{}

	mu      sync.Mutex
	events  []event
	errs    map[string]int
	samples map[string]string
	notes   []string
	done    bool
}

// startScenario starts the workers, each with a contender from newContender,
// and waits until the lock has been granted a few times.
func startScenario(t *testing.T, name, key string, ttl time.Duration, newContender func(i int) (contender, error), opts ...guard.LockOption) *scenario {
	t.Helper()
	s := &scenario{
		t: t, name: name, key: key, ttl: ttl, opts: opts,
		prefix:  prefixOf(name),
		logs:    &warnCounter{counts: map[string]int{}, first: map[string]string{}},
		errs:    map[string]int{},
		samples: map[string]string{},
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	started := false
	t.Cleanup(func() {
		switch {
		case s.done:
		case started:
			s.stopWorkers()
		default:
			for _, w := range s.workers {
				w.close()
			}
		}
	})
	for i := range contenders {
		c, err := newContender(i)
		if err != nil {
			t.Fatalf("contender %d: %v", i, err)
		}
		w := &worker{id: i, close: c.close, done: make(chan struct{}), every: c.every}
		g, err := guard.New(c.locker, guard.WithTTL(ttl), guard.WithPrefix(s.prefix),
			guard.WithOwner(fmt.Sprintf("%s-worker-%d", name, i)),
			guard.WithLogger(slog.New(workerLog{s.logs, &w.releaseFailed})), guard.WithBackendName(name))
		if err != nil {
			c.close()
			t.Fatalf("guard %d: %v", i, err)
		}
		w.g = g
		s.workers = append(s.workers, w)
	}
	s.start = time.Now()
	s.event(event{name: "start", at: s.start})
	for _, w := range s.workers {
		go s.loop(ctx, w)
	}
	s.watching = make(chan struct{})
	go func() {
		defer close(s.watching)
		s.watchStalls(ctx)
	}()
	started = true
	if _, err := poll(30*time.Second, func() bool { return s.store.grantsSince(s.start) >= 2*settleGrants }); err != nil {
		t.Fatalf("%s: the lock was granted %d times in the first 30s, before any fault; errors: %v",
			name, s.store.grantsSince(s.start), s.errorSummary())
	}
	return s
}

func (s *scenario) loop(ctx context.Context, w *worker) {
	defer close(w.done)
	defer func() { w.stopped = time.Now() }()
	for ctx.Err() == nil {
		called := time.Now()
		var sec *section
		var lock *guard.Lock
		w.releaseFailed.Store(false)
		err := w.g.Do(ctx, s.key, func(lctx context.Context, l *guard.Lock) error {
			sec, lock = s.store.begin(w.id, l.Token(), time.Now()), l
			if debug {
				fmt.Printf("%s grant: %s worker %d token %d\n", sec.granted.Format("15:04:05.000"), s.name, w.id, sec.token)
			}
			defer func() { s.store.end(sec, time.Now()) }()
			v := s.store.read(sec)
			for range 2 {
				// A section whose context ends (its lock lost) stops
				// writing; one that cannot know goes on, and the fence
				// must stop it.
				if err := pause(lctx, hold); err != nil {
					return err
				}
				v++
				s.store.write(sec, v)
			}
			return nil
		}, s.opts...)
		returned := time.Now()
		if sec != nil && w.releaseFailed.Load() {
			// The key stays taken on the server until the lease runs out:
			// the judge must not take that time for a free key.
			until := lock.Expiry()
			s.store.leaseLeft(sec, until)
			s.note("worker %d's release was refused at %s; the lease it got at %s kept the key until %s",
				w.id, returned.Format("15:04:05.000"), sec.granted.Format("15:04:05.000"), until.Format("15:04:05.000"))
		}
		if sec != nil {
			s.store.released(sec, returned)
			s.store.waited(w.id, called, sec.granted)
		} else {
			s.store.waited(w.id, called, returned)
		}
		if err == nil || ctx.Err() != nil {
			if w.every > 0 {
				pause(ctx, time.Until(time.Now().Truncate(w.every).Add(w.every)))
			}
			continue
		}
		s.countErr(err)
		// An error that comes back at once (a refused connection) must
		// not turn the loop into a spin that starves the machine.
		pause(ctx, 20*time.Millisecond)
	}
}

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

func (s *scenario) countErr(err error) {
	kind := "other"
	switch {
	case errors.Is(err, guard.ErrLockLost):
		kind = "lost"
	case errors.Is(err, guard.ErrUnavailable):
		kind = "unavailable"
	case errors.Is(err, guard.ErrNotAcquired):
		kind = "not acquired"
	}
	if debug {
		fmt.Printf("%s Do: %v\n", time.Now().Format("15:04:05.000"), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs[kind]++
	if _, ok := s.samples[kind]; !ok {
		s.samples[kind] = err.Error()
	}
}

func (s *scenario) errorSummary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for k, n := range s.errs {
		parts = append(parts, fmt.Sprintf("%s: %d (first: %s)", k, n, s.samples[k]))
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

func (s *scenario) event(e event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
	if debug {
		fmt.Printf("%s event: %s (ready %s)\n", e.at.Format("15:04:05.000"), e.name, e.ready.Format("15:04:05.000"))
	}
	if e.name != "start" {
		ready := "at once"
		if !e.ready.IsZero() {
			ready = "after " + e.ready.Sub(e.at).Round(time.Millisecond).String()
		}
		s.t.Logf("%s: %s (cluster serving %s)", s.name, e.name, ready)
	}
}

func (s *scenario) note(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := fmt.Sprintf(format, args...)
	s.notes = append(s.notes, n)
	s.t.Logf("%s: %s", s.name, n)
}

// settle waits until at least atLeast has passed since since and the lock has
// been granted a few times after it. It does not fail the test: the judges
// do, from the history, when the lock did not come back in time.
func (s *scenario) settle(since time.Time, atLeast time.Duration) {
	s.t.Helper()
	_, err := poll(atLeast+20*time.Second, func() bool {
		return time.Since(since) >= atLeast && s.store.grantsSince(since) >= settleGrants
	})
	if err != nil {
		s.t.Errorf("%s: only %d grants in the %v after %s; errors so far: %s", s.name,
			s.store.grantsSince(since), time.Since(since).Round(time.Second), since.Format("15:04:05.000"), s.errorSummary())
	}
}

// watchStalls describes each stretch of more than the TTL and 5s without a
// grant while it lasts, once per stretch: what holds or waits on the
// servers and in the workers is gone by the time a judge reads the history.
// A stall after some grants that followed a fault is as much a defect as
// one right after it.
func (s *scenario) watchStalls(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var described time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		last := s.store.lastGrant()
		if last.IsZero() || last.Equal(described) || time.Since(last) <= s.ttl+5*time.Second {
			continue
		}
		described = last
		s.describeStall(last)
	}
}

// describeStall logs what the servers and the workers' goroutines were doing
// while the lock was not granted.
func (s *scenario) describeStall(since time.Time) {
	s.t.Logf("%s: no grant in the %v since %s; errors so far: %s; guard warnings: %s", s.name,
		time.Since(since).Round(time.Millisecond), since.Format("15:04:05.000"), s.errorSummary(), s.logs.summary())
	if s.diagnose != nil {
		s.t.Logf("%s: servers: %s", s.name, s.diagnose())
	}
	s.t.Logf("%s: workers' goroutines inside warden:\n%s", s.name, wardenStacks())
}

// wardenStacks returns the stacks of the goroutines that are inside a
// warden backend, the ones a stall is made of.
func wardenStacks() string {
	buf := make([]byte, 8<<20)
	all := string(buf[:runtime.Stack(buf, true)])
	var keep []string
	for g := range strings.SplitSeq(all, "\n\n") {
		if strings.Contains(g, "warden/backends/") {
			keep = append(keep, g)
		}
	}
	return strings.Join(keep, "\n\n")
}

// stopWorkers cancels the workers and waits for each within stopWithin, then
// closes every contender within stopWithin. It returns what hung.
func (s *scenario) stopWorkers() (stop time.Time, hung []string) {
	stop = time.Now()
	s.cancel()
	// It logs, which it must not do once the test has ended.
	<-s.watching
	deadline := time.NewTimer(stopWithin)
	defer deadline.Stop()
	for _, w := range s.workers {
		select {
		case <-w.done:
		case <-deadline.C:
		}
	}
	var slow time.Duration
	for _, w := range s.workers {
		select {
		case <-w.done:
			slow = max(slow, w.stopped.Sub(stop))
		default:
			hung = append(hung, fmt.Sprintf("worker %d did not return from Do within %v of the stop", w.id, stopWithin))
		}
	}
	if len(hung) > 0 {
		s.t.Logf("%s: goroutines inside warden with workers hung:\n%s", s.name, wardenStacks())
	}
	closed := make([]chan error, len(s.workers))
	for i, w := range s.workers {
		closed[i] = make(chan error, 1)
		go func() { closed[i] <- w.close() }()
	}
	for i, c := range closed {
		select {
		case err := <-c:
			if err != nil {
				s.t.Logf("%s: closing worker %d: %v", s.name, i, err)
			}
		case <-time.After(stopWithin):
			hung = append(hung, fmt.Sprintf("closing worker %d's Locker and client took more than %v", i, stopWithin))
		}
	}
	s.done = true
	s.t.Logf("%s: slowest worker returned %v after the stop", s.name, slow.Round(time.Millisecond))
	return stop, hung
}

// finish stops the workload, checks with leftovers (polling until it
// returns nil or its deadline) that the servers hold nothing of the run,
// judges the history, and records the verdict for the summary table.
func (s *scenario) finish(leftovers func() error, within time.Duration) verdict {
	s.t.Helper()
	stop, hung := s.stopWorkers()
	sections, accepted, refused, overlapCount, overlaps := s.store.snapshot()
	s.mu.Lock()
	events := slices.Clone(s.events)
	notes := slices.Clone(s.notes)
	s.mu.Unlock()
	leaseBound := s.ttl
	if s.electionBound {
		leaseBound = 0
	}
	v := judge(s.name, sections, accepted, refused, overlapCount, overlaps, events, leaseBound, stop)
	judgeFreeWaiting(&v, sections, s.store.waitsSnapshot(), stop, s.judgeFree)
	v.notes = append(notes, v.notes...)
	v.failures = append(v.failures, hung...)
	if leftovers != nil {
		var last error
		if _, err := poll(within, func() bool { last = leftovers(); return last == nil }); err != nil {
			v.failures = append(v.failures, fmt.Sprintf("left behind %v after the workload drained: %v", within, last))
		}
	}
	if v.cycles < settleGrants*len(events) {
		v.failures = append(v.failures, fmt.Sprintf("only %d grants for %d events: the workload hardly ran", v.cycles, len(events)))
	}
	v.notes = append(v.notes, "errors from Do: "+s.errorSummary(), "guard warnings: "+s.logs.summary())
	for _, e := range v.events {
		s.t.Logf("%s: %-40s longest without a grant %7v (bound %v), longest free while a worker waited %v", s.name, e.name,
			e.unavailable.Round(time.Millisecond), e.bound.Round(time.Millisecond), e.freeWaiting.Round(time.Millisecond))
	}
	if v.freeAt != "" {
		s.t.Logf("%s: longest free while waiting: %s", s.name, v.freeAt)
	}
	for _, n := range v.notes {
		s.t.Logf("%s: %s", s.name, n)
	}
	for _, f := range v.failures {
		s.t.Errorf("%s: %s", s.name, f)
	}
	record(v)
	return v
}

// warnCounter is the Guards' logger: it counts warnings (losses, failed
// releases) by message rather than printing hundreds of them.
type warnCounter struct {
	mu     sync.Mutex
	counts map[string]int
	first  map[string]string // the first error attached to each message
}

func (h *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *warnCounter) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *warnCounter) WithGroup(string) slog.Handler                { return h }
func (h *warnCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[r.Message]++
	if _, ok := h.first[r.Message]; !ok {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				h.first[r.Message] = a.Value.String()
			}
			return true
		})
	}
	if debug {
		var attrs []string
		r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a.String()); return true })
		fmt.Printf("%s guard: %s %s\n", r.Time.Format("15:04:05.000"), r.Message, strings.Join(attrs, " "))
	}
	return nil
}

// workerLog is one worker's Guard logger: the scenario's warnCounter, which
// also tells the worker that its release was refused. Only a refusal by a
// server that keeps the lease counts: a Redis master that answered
// CLUSTERDOWN. A release that got no answer may have freed the key, and a
// dead master's lease is gone with it (what the promoted replica still
// held is the event's heldUntil): the judge must not excuse a waiter that
// sat on a key free then.
type workerLog struct {
	*warnCounter
	releaseFailed *atomic.Bool
}

func (h workerLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "warden: release failed; the lock may stay taken until its lease expires on the server" {
		r.Attrs(func(a slog.Attr) bool {
			if e := a.Value.String(); a.Key == "error" && strings.Contains(e, "CLUSTERDOWN") {
				h.releaseFailed.Store(true)
			}
			return true
		})
	}
	return h.warnCounter.Handle(ctx, r)
}

func (h workerLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h workerLog) WithGroup(string) slog.Handler      { return h }

// debug (WARDEN_CLUSTERS_DEBUG=1) prints every guard warning and every error
// from Do as it happens, with its time, to follow a failure as it unfolds.
var debug = os.Getenv("WARDEN_CLUSTERS_DEBUG") != ""

func (h *warnCounter) summary() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var parts []string
	for m, n := range h.counts {
		p := fmt.Sprintf("%d× %q", n, m)
		if e := h.first[m]; e != "" {
			p += " (first error: " + e + ")"
		}
		parts = append(parts, p)
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

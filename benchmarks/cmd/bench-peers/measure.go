package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cycleResult is one uncontended or contended measurement. Durations are in
// milliseconds; NaN marks a figure that does not apply or was not counted.
type cycleResult struct {
	ops       float64 // acquisitions per second
	p50, p99  float64 // uncontended: a whole lock-unlock cycle; contended: the wait for the lock
	hand50    float64 // release to next grant
	hand99    float64
	back      float64 // share of handoffs back to the releaser
	cmds      float64 // server commands per acquisition
	trips     float64 // round trips per acquisition
	idle      float64 // uncontended: the machine's CPU idle entries per cycle (see idleEntries); NaN when not read
	foreign   bool    // another client used the server meanwhile: cmds is an upper bound
	errs      int     // acquisitions that failed
	acquiring int     // acquisitions counted
	held      float64 // contended: the mean time a section really slept
}

func (r cycleResult) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%10.0f ops/s  p50 %s  p99 %s", r.ops, ms(r.p50), ms(r.p99))
	if !math.IsNaN(r.hand50) {
		fmt.Fprintf(&sb, "  handoff p50 %s p99 %s  back %s  hold %s", ms(r.hand50), ms(r.hand99), percent(r.back), ms(r.held))
	}
	if !math.IsNaN(r.cmds) {
		fmt.Fprintf(&sb, "  cmds %.2f trips %.2f", r.cmds, r.trips)
	}
	if !math.IsNaN(r.idle) {
		fmt.Fprintf(&sb, "  cpu idle entries %.2f", r.idle)
	}
	if r.foreign {
		sb.WriteString("  (server shared)")
	}
	if r.errs > 0 {
		fmt.Fprintf(&sb, "  %d errors", r.errs)
	}
	return sb.String()
}

// renewResult is one renewal measurement.
type renewResult struct {
	trips   float64 // round trips per renewal period
	cmds    float64 // server commands (statements) per renewal period
	heap    float64 // bytes of heap per held lock
	stack   float64 // bytes of goroutine stacks per held lock
	lost    int     // locks lost while held, or found expired by their release
	foreign bool
}

func (r renewResult) String() string {
	s := fmt.Sprintf("trips/period %.1f  cmds/period %.1f  heap/lock %.0f B  stack/lock %.0f B  lost %d",
		r.trips, r.cmds, r.heap, r.stack, r.lost)
	if r.foreign {
		s += "  (server shared)"
	}
	return s
}

func ms(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v < 0:
		// An added latency can come out below zero: the guarded p99
		// under the unguarded one.
		return "−" + ms(-v)
	case v < 0.001:
		return fmt.Sprintf("%.0f ns", v*1e6)
	case v < 0.01:
		return fmt.Sprintf("%.1f µs", v*1e3)
	case v < 1:
		return fmt.Sprintf("%.0f µs", v*1e3)
	case v < 100:
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

func percent(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.0f%%", 100*v)
}

// quantile of samples (sorted in place).
func quantile(samples []float64, q float64) float64 {
	if len(samples) == 0 {
		return math.NaN()
	}
	slices.Sort(samples)
	i := int(math.Ceil(q*float64(len(samples)))) - 1
	return samples[min(max(i, 0), len(samples)-1)]
}

func durMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (b *bench) meterFor(sub *subject) *meter {
	kind := countNothing
	switch {
	case len(sub.redis) > 0:
		kind = countRedis
	case sub.group == "postgres":
		kind = countSQL
	case sub.group == "consul":
		kind = countHTTP
	}
	return newMeter(kind, b.admin, sub.redis)
}

func nop() {}

// uncontendedRun is one subject's worker in a repetition of the
// uncontended scenario, and what its slices have measured so far.
type uncontendedRun struct {
	sub     *subject
	m       *meter
	fx      fixture
	w       worker
	key     string
	samples []float64
	cycles  int
	elapsed time.Duration
	cmds    float64
	trips   float64
	idle    float64 // CPU idle entries; NaN once they could not be read
	foreign bool
}

func (r *uncontendedRun) close() {
	r.w.close()
	r.fx.close()
}

// result is what r's slices measured, together.
func (r *uncontendedRun) result() cycleResult {
	return cycleResult{
		ops:       float64(r.cycles) / r.elapsed.Seconds(),
		p50:       quantile(r.samples, 0.50),
		p99:       quantile(r.samples, 0.99),
		hand50:    math.NaN(),
		hand99:    math.NaN(),
		back:      math.NaN(),
		cmds:      r.cmds / float64(r.cycles),
		trips:     r.trips / float64(r.cycles),
		idle:      r.idle / float64(r.cycles),
		foreign:   r.foreign,
		acquiring: r.cycles,
		held:      math.NaN(),
	}
}

// uncontended times lock-unlock cycles of one worker per subject, each on a
// key nobody else wants, in one repetition. Each subject's window is cut
// into slices, and the slices run in turns, one subject after the other in
// an order rotated each turn: on a shared machine the speed of a loopback
// round trip changes for seconds at a time, for every client alike (a
// 1.5s window of the raw floor ran at 17,800 cycles/s and the next one at
// 10,000), so a subject measured in one window took the machine's state of
// that window into its ratio; in turns, every subject meets the same
// states in about the same shares. It returns the subjects it measured,
// with their results, and notes the others as failed.
func (b *bench) uncontended(ctx context.Context, subs []*subject, rep int) ([]*subject, []cycleResult, error) {
	var runs []*uncontendedRun
	defer func() {
		for _, r := range runs {
			r.close()
		}
	}()
	for _, sub := range subs {
		r, err := b.startUncontended(ctx, sub, rep)
		if err != nil {
			if err := b.note(ctx, err, "uncontended", sub, 1, rep); err != nil {
				return nil, nil, err
			}
			continue
		}
		runs = append(runs, r)
	}
	slice := b.s.uncontended / time.Duration(b.s.slices)
	failed := map[*uncontendedRun]bool{}
	for turn := range b.s.slices {
		for _, r := range rotate(runs, rep+turn) {
			if failed[r] {
				continue
			}
			if err := b.uncontendedSlice(ctx, r, slice); err != nil {
				failed[r] = true
				if err := b.note(ctx, err, "uncontended", r.sub, 1, rep); err != nil {
					return nil, nil, err
				}
			}
		}
	}
	var (
		measured []*subject
		results  []cycleResult
	)
	for _, r := range runs {
		if !failed[r] {
			measured = append(measured, r.sub)
			results = append(results, r.result())
		}
	}
	return measured, results, nil
}

// startUncontended makes sub's worker for a repetition, and warms it up.
func (b *bench) startUncontended(ctx context.Context, sub *subject, rep int) (*uncontendedRun, error) {
	m := b.meterFor(sub)
	fx, err := sub.fixture(ctx, m)
	if err != nil {
		return nil, err
	}
	w, err := fx.worker(ctx)
	if err != nil {
		fx.close()
		return nil, err
	}
	r := &uncontendedRun{sub: sub, m: m, fx: fx, w: w, key: b.keyFor("uncontended", sub.id, 1, rep, 0), samples: make([]float64, 0, 1<<14)}
	// Connections opened, scripts cached, sessions started: none of that is
	// part of a cycle in a long-lived process.
	for range 3 {
		if err := w.cycle(ctx, r.key, nop); err != nil {
			r.close()
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	return r, nil
}

// uncontendedSlice runs r's cycles for one slice of its window. A slice in
// which another client used the server is measured again, up to lastTry
// times, and then kept, marked.
func (b *bench) uncontendedSlice(ctx context.Context, r *uncontendedRun, slice time.Duration) error {
	batch := max(1, r.sub.batch)
	for try := 0; ; try++ {
		before, err := r.m.snapshot(ctx)
		if err != nil {
			return err
		}
		samples, cycles := r.samples, 0
		idle0, idleOK := idleEntries(cpuIdleRoot)
		start := time.Now()
		deadline := start.Add(slice)
		for {
			t0 := time.Now()
			if !t0.Before(deadline) {
				break
			}
			for range batch {
				if err := r.w.cycle(ctx, r.key, nop); err != nil {
					return err
				}
			}
			samples = append(samples, durMS(time.Since(t0))/float64(batch))
			cycles += batch
		}
		elapsed := time.Since(start)
		idle1, ok := idleEntries(cpuIdleRoot)
		idle := float64(idle1 - idle0)
		if !idleOK || !ok {
			idle = math.NaN()
		}
		after, err := r.m.snapshot(ctx)
		if err != nil {
			return err
		}
		wk := r.m.between(before, after)
		if wk.foreign && try < lastTry {
			b.res.retries++
			fmt.Fprintf(b.log, "  another client used the server meanwhile: measuring %s's slice again\n", r.sub.label)
			continue
		}
		r.samples, r.cycles, r.elapsed = samples, r.cycles+cycles, r.elapsed+elapsed
		r.cmds, r.trips, r.idle, r.foreign = r.cmds+wk.cmds, r.trips+wk.trips, r.idle+idle, r.foreign || wk.foreign
		return nil
	}
}

// grant is what a contender notes when it is granted the lock.
type grant struct {
	wait    float64 // ms from asking to being granted
	handoff float64 // ms from the previous holder starting its release; NaN for the first
	back    int8    // 1: the previous holder again; 0: another; -1: no previous holder
}

// contended runs n workers, each with clients of its own, taking turns on
// one key for the window; each holds the lock for the hold time and asks
// again at once, the hardest case for fairness.
func (b *bench) contended(ctx context.Context, sub *subject, n int, hold time.Duration, rep, try int) (cycleResult, error) {
	m := b.meterFor(sub)
	fx, err := sub.fixture(ctx, m)
	if err != nil {
		return cycleResult{}, err
	}
	defer fx.close()
	workers := make([]worker, n)
	defer func() {
		for _, w := range workers {
			if w != nil {
				w.close()
			}
		}
	}()
	err = parallel(ctx, n, 8, func(ctx context.Context, i int) error {
		w, err := fx.worker(ctx)
		workers[i] = w
		return err
	})
	if err != nil {
		return cycleResult{}, err
	}
	key := b.keyFor(fmt.Sprintf("contended-%v", hold), sub.id, n, rep, try)
	for _, w := range workers {
		if err := w.cycle(ctx, key, nop); err != nil {
			return cycleResult{}, fmt.Errorf("warm-up: %w", err)
		}
	}

	var (
		base       = time.Now()
		lastRel    atomic.Int64 // ns after base when the last holder began releasing; 0: none yet
		lastHolder atomic.Int64
		errs       atomic.Int64
		inside     atomic.Int64 // holders in their section right now
		overlaps   atomic.Int64
		held       atomic.Int64 // ns spent in sections
		sections   atomic.Int64
		deadline   time.Duration // set before the workers start
		grants     = make([][]grant, n)
		wg         sync.WaitGroup
		begin      = make(chan struct{})
	)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-begin
			mine := make([]grant, 0, 1024)
			defer func() { grants[i] = mine }()
			for runCtx.Err() == nil {
				asked := time.Since(base)
				err := w.cycle(runCtx, key, func() {
					got := time.Since(base)
					if got < deadline {
						g := grant{wait: durMS(got - asked), handoff: math.NaN(), back: -1}
						if rel := lastRel.Load(); rel > 0 {
							g.handoff = durMS(got - time.Duration(rel))
							g.back = 0
							if lastHolder.Load() == int64(i) {
								g.back = 1
							}
						}
						mine = append(mine, g)
					}
					// Two holders at once would make every other figure
					// meaningless: counted, and reported as a failure.
					if inside.Add(1) > 1 {
						overlaps.Add(1)
					}
					if hold > 0 {
						h0 := time.Now()
						time.Sleep(hold)
						held.Add(int64(time.Since(h0)))
						sections.Add(1)
					}
					inside.Add(-1)
					lastHolder.Store(int64(i))
					lastRel.Store(int64(time.Since(base)))
				})
				if err != nil && runCtx.Err() == nil {
					errs.Add(1)
					settle(runCtx, 10*time.Millisecond)
				}
			}
		}()
	}
	before, err := m.snapshot(ctx)
	if err != nil {
		close(begin)
		cancel()
		wg.Wait()
		return cycleResult{}, err
	}
	deadline = time.Since(base) + b.s.contended
	close(begin)
	settle(ctx, b.s.contended)
	after, aerr := m.snapshot(ctx)
	// Waiters still queued are told to give up; ZooKeeper's and
	// sync.Mutex's cannot be, and drain through the lock instead.
	cancel()
	wg.Wait()
	if aerr != nil {
		return cycleResult{}, aerr
	}

	var waits, hands []float64
	backs, handoffs := 0, 0
	for _, gs := range grants {
		for _, g := range gs {
			waits = append(waits, g.wait)
			if g.back >= 0 {
				hands = append(hands, g.handoff)
				handoffs++
				backs += int(g.back)
			}
		}
	}
	acq := len(waits)
	if acq == 0 {
		return cycleResult{}, fmt.Errorf("no acquisition in %v (%d errors)", b.s.contended, errs.Load())
	}
	if n := overlaps.Load(); n > 0 {
		return cycleResult{}, fmt.Errorf("mutual exclusion broken: %d sections overlapped another", n)
	}
	wk := m.between(before, after)
	r := cycleResult{
		ops:       float64(acq) / b.s.contended.Seconds(),
		p50:       quantile(waits, 0.50),
		p99:       quantile(waits, 0.99),
		hand50:    quantile(hands, 0.50),
		hand99:    quantile(hands, 0.99),
		back:      math.NaN(),
		idle:      math.NaN(),
		cmds:      wk.cmds / float64(acq),
		trips:     wk.trips / float64(acq),
		foreign:   wk.foreign,
		errs:      int(errs.Load()),
		acquiring: acq,
		held:      math.NaN(),
	}
	if k := sections.Load(); k > 0 {
		r.held = durMS(time.Duration(held.Load() / k))
	}
	if handoffs > 0 {
		r.back = float64(backs) / float64(handoffs)
	}
	return r, nil
}

// renewal holds n locks of one process and counts what keeping them alive
// costs per renewal period, and how much memory they take.
func (b *bench) renewal(ctx context.Context, sub *subject, n, rep, try int) (renewResult, error) {
	m := b.meterFor(sub)
	ttl := b.renewTTL(sub)
	h, err := sub.holder(ctx, m, ttl)
	if err != nil {
		return renewResult{}, err
	}
	defer h.close()
	keys := make([]string, n)
	prefix := b.keyFor("renewal", sub.id, n, rep, try)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/%d", prefix, i)
	}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	if err := h.hold(ctx, keys); err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		h.release(rctx)
		cancel()
		return renewResult{}, err
	}
	// Locks taken over a while fall into step with the keeper's first
	// round; what is measured is the steady state after it.
	period := ttl / 3
	if err := settle(ctx, max(period+period/2, sub.quietAfter)); err != nil {
		return renewResult{}, err
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	s0, err := m.snapshot(ctx)
	if err != nil {
		return renewResult{}, err
	}
	t0 := time.Now()
	if err := settle(ctx, time.Duration(b.renewPeriods(sub))*period); err != nil {
		return renewResult{}, err
	}
	s1, err := m.snapshot(ctx)
	if err != nil {
		return renewResult{}, err
	}
	periods := float64(time.Since(t0)) / float64(period)
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := h.release(rctx); err != nil {
		return renewResult{}, fmt.Errorf("release: %w", err)
	}
	lost := h.lost()
	wk := m.between(s0, s1)
	return renewResult{
		trips:   wk.trips / periods,
		cmds:    wk.cmds / periods,
		heap:    growth(m0.HeapAlloc, m1.HeapAlloc, n),
		stack:   growth(m0.StackInuse, m1.StackInuse, n),
		lost:    lost,
		foreign: wk.foreign,
	}, nil
}

// renewTTL is the renewal scenario's TTL for sub: -ttl, or the shortest its
// server accepts when that is longer.
func (b *bench) renewTTL(sub *subject) time.Duration { return max(b.s.renewTTL, sub.minTTL) }

// renewPeriods is how many periods the renewal scenario counts for sub:
// -periods, or on a server with a shortest TTL (Consul) whole TTLs of three
// periods, over which both warden's renewals every TTL/3 and api.Lock's
// every TTL/2 come a whole number of times, so that neither count depends
// on where the window falls.
func (b *bench) renewPeriods(sub *subject) int {
	if sub.minTTL == 0 {
		return b.s.periods
	}
	return (b.s.periods + 2) / 3 * 3
}

// growth is the growth per lock; a figure lost in the noise of the rest of
// the process reads 0 rather than a negative size.
func growth(before, after uint64, n int) float64 {
	return max(0, float64(int64(after)-int64(before))/float64(n))
}

// results holds every repetition of every measurement.
type results struct {
	cycles   map[cycleKey][]cycleResult
	renewals map[renewKey][]renewResult
	idem     map[idemKey][]idemResult
	failures []string
	retries  int // measurements taken again because another client used the server
}

type cycleKey struct {
	scenario string
	n        int
	hold     time.Duration // contended: how long each section held the lock
	subject  string
}

type renewKey struct {
	n       int
	subject string
}

func newResults() *results {
	return &results{cycles: map[cycleKey][]cycleResult{}, renewals: map[renewKey][]renewResult{}, idem: map[idemKey][]idemResult{}}
}

func (r *results) addCycle(k cycleKey, c cycleResult) {
	r.cycles[k] = append(r.cycles[k], c)
}

func (r *results) addRenewal(n int, subject string, c renewResult) {
	k := renewKey{n, subject}
	r.renewals[k] = append(r.renewals[k], c)
}

// median of f over rs, ignoring NaN; NaN when nothing is left.
func median[T any](rs []T, f func(T) float64) float64 {
	var vs []float64
	for _, r := range rs {
		if v := f(r); !math.IsNaN(v) {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return math.NaN()
	}
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

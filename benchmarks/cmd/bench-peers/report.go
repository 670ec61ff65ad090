package main

import (
	"bufio"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// machine describes where the run happened, for the report.
type machine struct {
	cpu        string
	cpus       int
	gomaxprocs int
	goVersion  string
	platform   string
	kernel     string
	loadBefore string
	loadAfter  string
	servers    []string
	date       time.Time
}

func describeMachine() machine {
	m := machine{
		cpu:        "unknown",
		cpus:       runtime.NumCPU(),
		gomaxprocs: runtime.GOMAXPROCS(0),
		goVersion:  runtime.Version(),
		platform:   runtime.GOOS + "/" + runtime.GOARCH,
		loadBefore: loadAverage(),
		date:       time.Now().UTC(),
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if name, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(name) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	return m
}

// loadAverage is the 1, 5 and 15 minute load averages, which tell whether
// something else ran on the machine.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// writeOutputs writes the report and the chart.
func (b *bench) writeOutputs() error {
	b.machine.loadAfter = loadAverage()
	chart := b.chartData()
	pngPath := filepath.Join(b.s.out, b.s.pngName)
	if err := writeChart(pngPath, chart, b.chartTitle()); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	mdPath := filepath.Join(b.s.out, b.s.mdName)
	if err := os.WriteFile(mdPath, []byte(b.markdown()), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(b.log, "wrote %s and %s\n", mdPath, pngPath)
	return nil
}

func (b *bench) chartTitle() string {
	return fmt.Sprintf("warden vs peers, same run, median of %d (%s, %d CPUs)", b.s.reps, b.machine.date.Format("2006-01-02"), b.machine.cpus)
}

// ratio is warden's figure over the peer's.
func ratio(w, p float64) float64 {
	if math.IsNaN(w) || math.IsNaN(p) || p == 0 {
		return math.NaN()
	}
	return w / p
}

func fmtRatio(r float64) string {
	switch {
	case math.IsNaN(r) || math.IsInf(r, 0):
		return "—"
	case r >= 100:
		return fmt.Sprintf("%.0f×", r)
	case r >= 10:
		return fmt.Sprintf("%.1f×", r)
	case r < 0.1:
		// Two significant digits, so that 1 round trip against 9,997
		// does not read as zero.
		return strconv.FormatFloat(r, 'g', 2, 64) + "×"
	}
	return fmt.Sprintf("%.2f×", r)
}

func fmtCount(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtBytes(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case math.Abs(v) >= 10*1024:
		return fmt.Sprintf("%.1f KiB", v/1024)
	}
	return fmt.Sprintf("%.0f B", v)
}

// cell shows warden's figure beside the peer's and their ratio.
func cell(w, p float64, f func(float64) string, mark bool) string {
	s := fmt.Sprintf("%s / %s (%s)", f(w), f(p), fmtRatio(ratio(w, p)))
	if math.IsNaN(w) && math.IsNaN(p) {
		s = "—"
	}
	if mark {
		s += " †"
	}
	return s
}

// shares shows two shares without a ratio: a ratio of fairness means
// little.
func shares(w, p float64) string {
	if math.IsNaN(w) && math.IsNaN(p) {
		return "—"
	}
	return percent(w) + " / " + percent(p)
}

// counts shows two counts without a ratio: CPU idle entries per cycle are
// often near zero, where a ratio would be one of noise.
func counts(w, p float64) string {
	if math.IsNaN(w) && math.IsNaN(p) {
		return "—"
	}
	return fmtCount(w) + " / " + fmtCount(p)
}

func (b *bench) pairLabel(p pair) string {
	return b.subj[p.warden].label + " vs " + b.subj[p.peer].label
}

// cycleMedians are the medians of a subject's repetitions.
type cycleMedians struct {
	cycleResult
	reps int
}

func (b *bench) cycleMedian(k cycleKey) cycleMedians {
	rs := b.res.cycles[k]
	m := cycleMedians{reps: len(rs)}
	m.ops = median(rs, func(r cycleResult) float64 { return r.ops })
	m.p50 = median(rs, func(r cycleResult) float64 { return r.p50 })
	m.p99 = median(rs, func(r cycleResult) float64 { return r.p99 })
	m.hand50 = median(rs, func(r cycleResult) float64 { return r.hand50 })
	m.hand99 = median(rs, func(r cycleResult) float64 { return r.hand99 })
	m.back = median(rs, func(r cycleResult) float64 { return r.back })
	m.cmds = median(rs, func(r cycleResult) float64 { return r.cmds })
	m.trips = median(rs, func(r cycleResult) float64 { return r.trips })
	m.idle = median(rs, func(r cycleResult) float64 { return r.idle })
	for _, r := range rs {
		m.foreign = m.foreign || r.foreign
		m.errs += r.errs
	}
	return m
}

func (b *bench) renewMedian(n int, id string) (renewResult, int) {
	rs := b.res.renewals[renewKey{n, id}]
	m := renewResult{
		trips: median(rs, func(r renewResult) float64 { return r.trips }),
		cmds:  median(rs, func(r renewResult) float64 { return r.cmds }),
		heap:  median(rs, func(r renewResult) float64 { return r.heap }),
		stack: median(rs, func(r renewResult) float64 { return r.stack }),
	}
	for _, r := range rs {
		m.lost += r.lost
		m.foreign = m.foreign || r.foreign
	}
	return m, len(rs)
}

func (b *bench) markdown() string {
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format, a...) }
	mc := b.machine
	w("# Benchmarks: warden beside its peers\n\n")
	w("Written by `cd benchmarks && go run ./cmd/bench-peers%s` on %s; run it again rather than editing this file. ",
		argString(), mc.date.Format("2006-01-02 15:04 MST"))
	w("Every warden figure stands beside the peer's **from the same run**, with their ratio: ratios compare only within one run, never across runs or machines.\n\n")

	w("## Machine\n\n")
	w("- CPU: %s, %d logical CPUs (GOMAXPROCS %d)\n", mc.cpu, mc.cpus, mc.gomaxprocs)
	w("- Go: %s, %s", mc.goVersion, mc.platform)
	if mc.kernel != "" {
		w(", Linux %s", mc.kernel)
	}
	w("\n")
	for _, s := range mc.servers {
		w("- Server: %s, on this machine, over loopback\n", s)
	}
	w("- Load average (1, 5, 15 min) before the run: %s; after: %s\n", mc.loadBefore, mc.loadAfter)
	if b.s.note != "" {
		w("- Note: %s\n", b.s.note)
	}
	w("- Run: each group of pairs measured in a process of its own, one group after another; %d repetition(s) of every measurement, reported as medians; uncontended windows %v (in %d slices, in turns with the other subjects of the group), contended windows %v, holds %v; PostgreSQL lock tables aged by %d cycles each first; renewal TTL %v (renewal every %v), %d period(s) counted; measuring took %v\n",
		b.s.reps, b.s.uncontended, b.s.slices, b.s.contended, b.s.holds, b.s.churn, b.s.renewTTL, (b.s.renewTTL / 3).Round(time.Millisecond), b.s.periods, b.end.Sub(b.start).Round(time.Second))
	for _, g := range slices.Sorted(maps.Keys(b.skipped)) {
		w("- Left out: %s (%s)\n", g, b.skipped[g])
	}
	w("\n")

	w("## How to read it\n\n")
	w("Each cell is `warden / peer (warden ÷ peer)`. ↑ marks figures where more is better (a ratio above 1 favours warden), ↓ those where less is better (a ratio below 1 favours warden). ")
	w("Each group of pairs (%s) was measured in a process of its own, one group after another, as the services of users run, each with the clients of the one engine it uses: no group's clients, goroutines or heap shared a process with another's. Within a group, warden and its peers shared a process, and took their uncontended windows in turns. ", strings.Join(b.groups, ", "))
	w("Every worker has clients of its own (its own go-redis client, etcd client, ZooKeeper session, database connections, and for warden its own Locker and Guard), as separate processes would; the in-process pair (memory, sync.Mutex) shares one lock table, as goroutines do. ")
	w("Server commands are INFO commandstats deltas summed over the servers involved, so they include the commands Lua scripts run inside Redis (an EVALSHA whose script runs SET and INCR counts 3); round trips are counted by a go-redis hook (a pipeline is one). On PostgreSQL, statements are counted by a pgx tracer, and each is a round trip. On Consul, HTTP requests are counted by a counting http.RoundTripper in each client (api.Config.HttpClient), and each is a round trip, its \"server commands\" too (a /v1/txn counts once, whatever its operations; a blocking query counts once, when sent). etcd, ZooKeeper and in-process figures have no command counts (—). ")
	w("† marks a figure taken while another client used the same server: the server ran more of the subject's own commands than it sent, so the command count is an upper bound. ")
	w("Such a measurement is taken again, up to twice, before it is kept with the mark; this run took %d measurement(s) again.\n\n", b.res.retries)
	w("![the ratios that count](%s)\n\n", b.s.pngName)
	b.countedSection(w)

	if ps := b.selected("uncontended"); len(ps) > 0 && b.ran("uncontended") {
		w("## 1. Uncontended lock and unlock\n\n")
		w("One worker takes and releases a lock nobody else wants, as fast as it can, for %v per repetition, in %d slices taken in turns with the slices of the other subjects of its group (so that a change of the machine's speed meets both sides of a ratio alike). Latency is a whole cycle (acquire, empty section, release)", b.s.uncontended, b.s.slices)
		w("; in-process subjects are timed 100 cycles at a time, since reading the clock costs as much as their cycle. ")
		w("CPU idle entries are the times, per cycle, that any of the machine's CPUs halted (Linux cpuidle states other than POLL, whoever ran on them). ")
		w("They tell what a cycle of two loopback round trips mostly costs: a CPU halted while the client waits must be woken for the answer, which on a virtual machine costs tens of µs a wake-up. ")
		w("A client that hands each call to another goroutine (redsync) keeps a second runtime thread running and the CPUs halt less, so on an idle machine it beats a client that calls on its own goroutine (bsm/redislock, the raw floors), and on a busy machine, where the CPUs seldom halt, it is the slower one: the ratios of this section hold for a machine as idle, or as busy, as this run's.\n\n")
		w("| pair | cycles/s ↑ | p50 ↓ | p99 ↓ | server commands/cycle ↓ | round trips/cycle ↓ | CPU idle entries/cycle |\n|---|---|---|---|---|---|---|\n")
		for _, p := range ps {
			wm, pm := b.cycleMedian(cycleKey{"uncontended", 1, 0, p.warden}), b.cycleMedian(cycleKey{"uncontended", 1, 0, p.peer})
			w("| %s | %s | %s | %s | %s | %s | %s |\n", b.pairLabel(p),
				cell(wm.ops, pm.ops, fmtCount, false),
				cell(wm.p50, pm.p50, ms, false),
				cell(wm.p99, pm.p99, ms, false),
				cell(wm.cmds, pm.cmds, fmtCount, wm.foreign || pm.foreign),
				cell(wm.trips, pm.trips, fmtCount, false),
				counts(wm.idle, pm.idle))
		}
		w("\n")
	}

	if b.ran("contended") {
		i := 0
		for _, n := range b.s.contenders {
			for _, hold := range b.s.holds {
				i++
				w("## 2.%d. %d contenders on one key, hold %v\n\n", i, n, hold)
				w("%d workers, each with its own clients, take turns on one key for %v per repetition; ", n, b.s.contended)
				if hold > 0 {
					w("each holds the lock for a sleep of %v (%s on average, as measured) and asks again at once, which is the hardest case for fairness. ", hold, ms(b.meanHold(n, hold)))
				} else {
					w("each releases the lock as soon as it has it and asks again at once: the cost of an acquisition under contention, with nothing to hide it. ")
				}
				w("Wait is from asking to being granted; handoff is from the holder starting its release to the next grant; \"back to releaser\" is the share of handoffs won by the worker that had just released, which a fair lock keeps near 1/%d.\n\n", n)
				w("| pair | acquisitions/s ↑ | wait p50 ↓ | wait p99 ↓ | handoff p50 ↓ | handoff p99 ↓ | back to releaser | server commands/acquisition ↓ |\n|---|---|---|---|---|---|---|---|\n")
				for _, p := range b.selected("contended") {
					wm, pm := b.cycleMedian(cycleKey{"contended", n, hold, p.warden}), b.cycleMedian(cycleKey{"contended", n, hold, p.peer})
					w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", b.pairLabel(p),
						cell(wm.ops, pm.ops, fmtCount, false),
						cell(wm.p50, pm.p50, ms, false),
						cell(wm.p99, pm.p99, ms, false),
						cell(wm.hand50, pm.hand50, ms, false),
						cell(wm.hand99, pm.hand99, ms, false),
						shares(wm.back, pm.back),
						cell(wm.cmds, pm.cmds, fmtCount, wm.foreign || pm.foreign))
				}
				w("\n")
			}
		}
	}

	if b.ran("renewal") && len(b.selected("renewal")) > 0 {
		w("## 3. Keeping many locks alive\n\n")
		w("One process holds that many locks with a TTL of %v and keeps them alive for %d renewal period(s) of %v, after one period and a half to settle", b.s.renewTTL, b.s.periods, (b.s.renewTTL / 3).Round(time.Millisecond))
		if slices.ContainsFunc(b.selected("renewal"), func(p pair) bool { return p.group == "consul" }) {
			sub := b.subj["warden-consul"]
			ttl := b.renewTTL(sub)
			w(" (on Consul, whose sessions take TTLs from 10s, a TTL of %v, and %d periods of %v counted: a whole number of TTLs, over which api.Lock's renewals every TTL/2 come a whole number of times too)", ttl, b.renewPeriods(sub), (ttl / 3).Round(time.Millisecond))
		}
		if slices.ContainsFunc(b.selected("renewal"), func(p pair) bool { return b.subj[p.warden].quietAfter > 0 }) {
			w("; warden redislock's window starts %v after its last lock was taken, when no cleanup of an acquisition can still run (an acquisition whose first attempt got no answer within its 10ms, queued behind a renewal pipeline, leaves one that runs again up to 5.25s later: a run outside this report, holding 100,000 locks, counted 8 such acquisitions and 16 scripts after the last lock, which the window would otherwise count as renewals)", b.subj["warden-redis"].quietAfter)
		}
		w(". ")
		w("warden's lease keeper renews every lease due within the next period in one request; the Redis and PostgreSQL peers offer a per-lock Refresh or Extend and no keeper, so their locks are renewed the way their users write it, a goroutine per lock. On etcd, warden and concurrency.Mutex alike keep every lock on one session lease (its keepalive is not counted), so the memory per lock is what differs there; etcd is measured up to %d locks. ", etcdMaxLocks)
		w("On Consul, warden keeps every lock on one session, renewed by one request per period; api.Lock gives each lock a session of its own, renewed by a goroutine of its own every TTL/2, and a goroutine monitoring it with a blocking query, as its users get from LockOpts; Consul is measured up to %d locks. ", consulMaxLocks)
		w("Heap and stack per lock are the growth of the process's live heap (after a GC) and of its goroutine stacks, divided by the number of locks. ")
		w("A lock counts as lost when its holder finds it lost while held, or its release finds it no longer held (it ran out first), once either way. The per-lock renewal loops of the peers are written to lose nothing the peer itself does not: each lock is renewed until its own release (releasing 100,000 locks takes longer than their TTL), a renewal that fails (one that waited a period for a pool connection, say) is tried again at the next period, and a lock counts as lost only when the server says it is no longer held, or when no renewal was answered for a whole TTL. A loss is therefore the subject's own: a peer renewing each lock with a request of its own must send one per lock per period, and where it lost locks the round trips column shows how many it got through.\n\n")
		for _, n := range b.s.sizes {
			w("### %d held locks\n\n", n)
			w("| pair | round trips/period ↓ | server commands (statements)/period ↓ | heap/lock ↓ | stacks/lock ↓ | locks lost |\n|---|---|---|---|---|---|\n")
			for _, p := range b.selected("renewal") {
				wm, _ := b.renewMedian(n, p.warden)
				pm, _ := b.renewMedian(n, p.peer)
				w("| %s | %s | %s | %s | %s | %d / %d |\n", b.pairLabel(p),
					cell(wm.trips, pm.trips, fmtCount, false),
					cell(wm.cmds, pm.cmds, fmtCount, wm.foreign || pm.foreign),
					cell(wm.heap, pm.heap, fmtBytes, false),
					cell(wm.stack, pm.stack, fmtBytes, false),
					wm.lost, pm.lost)
			}
			w("\n")
			for _, sub := range b.subjectsFor("renewal") {
				if m, reps := b.renewMedian(n, sub.id); m.lost > 0 {
					w("- %s lost %d of %d locks over %d repetition(s), with %s round trips per period (median).\n", sub.label, m.lost, n*reps, reps, fmtCount(m.trips))
				}
			}
			w("\n")
		}
	}

	b.idemSection(w)
	b.tablesSection(w)

	w("## The subjects\n\n")
	seen := map[string]bool{}
	for _, p := range pairs {
		if !slices.Contains(b.groups, p.group) {
			continue
		}
		for _, id := range []string{p.warden, p.peer} {
			if seen[id] {
				continue
			}
			seen[id] = true
			s := b.subj[id]
			w("- **%s**: %s.\n", s.label, s.how)
		}
	}
	w("\nwarden is built from this checkout (a `replace` in benchmarks/go.mod); each warden worker uses `guard.New(locker, guard.WithTTL(10s), guard.WithPrefix(\"bench:\"), guard.WithLogger(a logger that discards))` and `Guard.Do`: the benchmark counts lost locks itself. ")
	w("Peers use a 10s TTL too, but for the Consul peers at their defaults, whose sessions have the client's default TTL of 15s. Each peer with a retry pause runs twice: at the settings its documentation shows, and tuned the way a user who wants the lock back at once would set it (a 1ms pause); their retry pauses, listed above, decide much of their handoff latency and command count.\n\n")

	errs := b.errorNotes()
	if len(b.res.failures) > 0 || len(errs) > 0 {
		w("## Failures\n\n")
		for _, f := range b.res.failures {
			w("- %s\n", f)
		}
		for _, e := range errs {
			w("- %s\n", e)
		}
		w("\n")
	}
	return sb.String()
}

// meanHold is the median over subjects and repetitions of the time a
// section really slept: a sleep is not exact, and the hold bounds the
// throughput of every subject alike.
func (b *bench) meanHold(n int, hold time.Duration) float64 {
	var all []cycleResult
	for k, rs := range b.res.cycles {
		if k.scenario == "contended" && k.n == n && k.hold == hold {
			all = append(all, rs...)
		}
	}
	return median(all, func(r cycleResult) float64 { return r.held })
}

// ran tells whether a scenario was part of the run.
func (b *bench) ran(scenario string) bool { return slices.Contains(b.s.scenarios, scenario) }

// errorNotes lists acquisitions that failed inside measurements that
// completed, and locks lost while held.
func (b *bench) errorNotes() []string {
	var out []string
	for k, rs := range b.res.cycles {
		n := 0
		for _, r := range rs {
			n += r.errs
		}
		if n > 0 {
			out = append(out, fmt.Sprintf("%s %d (hold %v), %s: %d acquisitions failed (over %d repetitions)", k.scenario, k.n, k.hold, b.subj[k.subject].label, n, len(rs)))
		}
	}
	for k, rs := range b.res.renewals {
		n := 0
		for _, r := range rs {
			n += r.lost
		}
		if n > 0 {
			out = append(out, fmt.Sprintf("renewal %d, %s: %d locks lost (over %d repetitions)", k.n, b.subj[k.subject].label, n, len(rs)))
		}
	}
	slices.Sort(out)
	return out
}

// argString is the command line, for the report to say how it was made.
func argString() string {
	if len(os.Args) <= 1 || strings.HasSuffix(os.Args[0], ".test") {
		return ""
	}
	var sb strings.Builder
	for _, a := range os.Args[1:] {
		sb.WriteByte(' ')
		sb.WriteString(shellQuote(a))
	}
	return sb.String()
}

// shellQuote quotes an argument the way a shell would need it.
func shellQuote(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,/:+") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

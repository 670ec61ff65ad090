//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

const (
	// ttl is every lease's TTL unless its scenario says otherwise: etcd
	// counts whole seconds, at least two, and ZooKeeper's session timeout
	// is the lease's.
	ttl            = 2 * time.Second
	releaseTimeout = time.Second
	// grantSlack: after a fault, the lock must be granted again within
	// the time the server may keep a dead holder's lease (its scenario's
	// keep) + grantSlack.
	grantSlack = time.Second
	// defaultHold is how long a section lingers between its two writes.
	defaultHold = 20 * time.Millisecond
	// markedHold is how long the section a fault is aimed at lingers, so
	// that the fault surely lands inside it.
	markedHold = 500 * time.Millisecond
	nWorkers   = 3
	// phaseWrites is how many accepted writes make a phase (before the
	// fault, and after the recovery).
	phaseWrites = 20
	// stopWithin: every worker must exit this soon after being told to stop.
	stopWithin = 10 * time.Second
	// phaseWithin bounds every wait for progress; only a broken lock or a
	// stuck worker reaches it.
	phaseWithin = 30 * time.Second
)

// quietRedis drops go-redis's own log lines in the test process, where
// refused connections to the servers a fault stopped are expected.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(runWorker(spec))
	}
	goredis.SetLogger(quietRedis{})
	code := m.Run()
	printTable(os.Stdout)
	printBoundsTable(os.Stdout)
	if p := os.Getenv("WARDEN_FAULTS_TABLE"); p != "" {
		if f, err := os.Create(p); err == nil {
			printTable(f)
			printBoundsTable(f)
			f.Close()
		}
	}
	os.Exit(code)
}

// runID keeps this run's keys, nodes and tables apart from other runs' on
// the shared servers.
var runID = strconv.FormatInt(time.Now().UnixNano()%(1<<40), 36)

// scenario is one backend under one fault.
type scenario struct {
	backend string
	fault   string
	// setup returns how to reach the backend, starting servers of the
	// suite's own when the fault needs to stop them (into r.servers).
	setup  func(t *testing.T, r *run) backendSpec
	inject func(r *run)
	// fenceLost: the fault makes the backend forget the tokens it issued
	// (a database that loses committed transactions in a crash), so
	// grants may carry older tokens: the store must refuse them, and they
	// are reported, not failed.
	fenceLost bool
	// lossy: the server is run in a way that loses acknowledged writes
	// when it crashes, which no lock can be asked to survive; such a
	// scenario shows what happens then, and runs only with
	// WARDEN_FAULTS_LOSSY=1.
	lossy bool
	// ttl is the leases' TTL when the backend accepts no shorter one
	// than the suite's ttl (Consul: 10 s); 0 means ttl.
	ttl time.Duration
	// keep is how long after its holder's last renewal the server may
	// keep a lease its holder no longer renews, which bounds when the lock
	// comes back; 0 means the TTL. A Consul server keeps a session twice
	// its TTL.
	keep time.Duration
}

// leaseTTL is the TTL of the scenario's leases.
func (sc scenario) leaseTTL() time.Duration {
	if sc.ttl > 0 {
		return sc.ttl
	}
	return ttl
}

// grantBound is how soon after a fault, or after the server came back, the
// lock must be granted again.
func (sc scenario) grantBound() time.Duration {
	if sc.keep > 0 {
		return sc.keep + grantSlack
	}
	return sc.leaseTTL() + grantSlack
}

// workerProc is one worker process.
type workerProc struct {
	id     int
	spec   backendSpec
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	log    string
	done   chan struct{}
	err    error
	exited time.Time
	killed bool
}

// faultRec is one fault as injected, and when the lock came back.
type faultRec struct {
	what   string
	victim int       // the worker it hit, or -1
	at     time.Time // when it hit
	from   time.Time // from when the lock can be granted again: at, or when the server answered again
	grant  time.Time // the first grant, to another worker than the victim, after from
}

// run is one scenario's state.
type run struct {
	t        *testing.T
	sc       scenario
	prefix   string
	dir      string
	spec     backendSpec
	st       *store
	servers  []*server
	proxies  []*drivertest.Proxy
	workers  []*workerProc
	faults   []faultRec
	notes    []string
	failures []string
	// selfTest: the judges' own test, which expects failures and keeps
	// them out of the test's result and the table.
	selfTest bool
	row      row // the verdict, once judged
	// slowestExit is how long the slowest worker took to exit once told.
	slowestExit time.Duration
}

func (r *run) fail(format string, args ...any) {
	r.t.Helper()
	msg := fmt.Sprintf(format, args...)
	r.failures = append(r.failures, msg)
	if !r.selfTest {
		r.t.Error(msg)
	}
}

func (r *run) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

var scenarioSeq int

func TestFaults(t *testing.T) {
	for _, sc := range scenarios() {
		t.Run(sc.fault+"/"+sc.backend, func(t *testing.T) { runScenario(t, sc) })
	}
}

func runScenario(t *testing.T, sc scenario) {
	if sc.lossy && os.Getenv("WARDEN_FAULTS_LOSSY") != "1" {
		t.Skip("a server that loses acknowledged writes: set WARDEN_FAULTS_LOSSY=1 to see what it does to the lock")
	}
	scenarioSeq++
	r := &run{t: t, sc: sc, prefix: fmt.Sprintf("wf-%s-%d:", runID, scenarioSeq)}
	r.dir = t.TempDir()
	r.spec = sc.setup(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch r.spec.Kind {
	case "sqlite", "postgres", "mariadb":
		if err := migrate(ctx, r.spec); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	defer func() {
		if err := cleanup(context.Background(), r.spec, r.prefix); err != nil {
			t.Logf("cleanup: %v", err)
		}
	}()
	st, err := startStore(defaultHold)
	if err != nil {
		t.Fatal(err)
	}
	r.st = st
	defer st.close()

	for i := range nWorkers {
		spec := r.spec
		if i == 0 && sc.fault == "proxy" {
			spec = r.proxied(spec)
		}
		r.spawn(spec)
	}
	started := time.Now()
	if _, err := r.awaitAccepted(started, phaseWrites); err != nil {
		r.fail("warm-up: %d accepted writes not reached within %v: %s", phaseWrites, phaseWithin, r.progress())
	} else {
		sc.inject(r)
		since := started
		for _, f := range r.faults {
			if f.grant.After(since) {
				since = f.grant
			}
		}
		if len(r.failures) == 0 {
			if _, err := r.awaitAccepted(since, phaseWrites); err != nil {
				r.fail("after the faults: %d accepted writes not reached within %v: %s", phaseWrites, phaseWithin, r.progress())
			}
		}
	}
	r.stopAll()
	r.checkLeftovers()
	r.judge()
}

// proxied puts a proxy of its own in front of each of spec's endpoints.
func (r *run) proxied(spec backendSpec) backendSpec {
	standIn := map[string]string{}
	for _, ep := range spec.endpoints() {
		p := drivertest.StartProxy(r.t, ep)
		r.proxies = append(r.proxies, p)
		standIn[ep] = p.Addr()
	}
	return spec.via(standIn)
}

// spawn starts a worker process: this test binary again, as a worker.
func (r *run) spawn(spec backendSpec) *workerProc {
	r.t.Helper()
	id := len(r.workers)
	raw, err := json.Marshal(workerSpec{ID: id, Store: r.st.addr(), Backend: spec, Prefix: r.prefix,
		TTL: r.sc.leaseTTL(), ReleaseTimeout: releaseTimeout})
	if err != nil {
		r.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	logPath := filepath.Join(r.dir, fmt.Sprintf("worker-%d.log", id))
	logf, err := os.Create(logPath)
	if err != nil {
		r.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// A worker stops when its stdin closes, but one stopped with SIGSTOP
	// cannot: it dies with the test process instead.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	w := &workerProc{id: id, spec: spec, cmd: cmd, stdin: stdin, log: logPath, done: make(chan struct{})}
	go func() {
		w.err = cmd.Wait()
		w.exited = time.Now()
		logf.Close()
		close(w.done)
	}()
	r.t.Cleanup(func() {
		select {
		case <-w.done:
		default:
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			<-w.done
		}
	})
	r.workers = append(r.workers, w)
	return w
}

func (w *workerProc) tail() string {
	b, _ := os.ReadFile(w.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// exitedBy waits until w has exited, or deadline.
func (w *workerProc) exitedBy(deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-w.done:
		return true
	case <-t.C:
	}
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// kill9 kills w with SIGKILL and waits until it is gone.
func (w *workerProc) kill9() {
	w.killed = true
	w.cmd.Process.Kill()
	<-w.done
}

// stopAll tells every live worker to stop, and fails any that does not exit
// cleanly within stopWithin; one that hangs is made to dump its goroutines
// first.
func (r *run) stopAll() {
	told := time.Now()
	for _, w := range r.workers {
		if !w.killed {
			w.cmd.Process.Signal(syscall.SIGCONT)
			w.stdin.Close()
		}
	}
	deadline := told.Add(stopWithin)
	for _, w := range r.workers {
		if w.killed {
			continue
		}
		if !w.exitedBy(deadline) {
			w.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-w.done:
			case <-time.After(5 * time.Second):
				w.cmd.Process.Kill()
				<-w.done
			}
			r.fail("worker %d did not exit within %v of being told to stop; its log (SIGQUIT dump at the end):\n%s",
				w.id, stopWithin, w.tail())
			continue
		}
		if w.err != nil {
			r.fail("worker %d exited %v after %v; its log:\n%s", w.id, w.err, time.Since(told).Round(time.Millisecond), w.tail())
		}
		if d := w.exited.Sub(told); d > r.slowestExit {
			r.slowestExit = d
		}
	}
}

// checkLeftovers fails the scenario if the drained workload left anything
// behind. Releases that could not be confirmed are retried in the
// background by some backends (ZooKeeper), so leftovers get a moment to go.
func (r *run) checkLeftovers() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deadline := time.Now().Add(2 * time.Second)
	for {
		left, err := leftovers(ctx, r.spec, r.prefix)
		if err != nil {
			r.fail("looking for leftovers: %v", err)
			return
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.fail("left behind after every worker exited: %s", strings.Join(left, "; "))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Waits on the store.

func (r *run) awaitAccepted(after time.Time, n int) (snapshot, error) {
	return r.st.await(phaseWithin, func(sn snapshot) bool {
		return sn.count(func(e *event) bool { return e.Op == "write" && e.Accepted && e.At.After(after) }) >= n
	})
}

// awaitGrant waits for the first section to start after after, in another
// worker than exclude (-1: any).
func (r *run) awaitGrant(after time.Time, exclude int, within time.Duration) (*event, error) {
	var got *event
	_, err := r.st.await(within, func(sn snapshot) bool {
		got = sn.find(func(e *event) bool { return e.Op == "read" && e.At.After(after) && e.Worker != exclude })
		return got != nil
	})
	return got, err
}

// awaitMarked marks the next section to start and waits until it has made
// its first write: its holder is then inside it, lingering for hold.
func (r *run) awaitMarked(hold time.Duration) (*event, error) {
	idx := r.st.markNext(hold)
	var first *event
	_, err := r.st.await(phaseWithin, func(sn snapshot) bool {
		if len(sn.marked) <= idx {
			return false
		}
		if ws := sn.writes(sn.marked[idx]); len(ws) > 0 {
			first = &ws[0]
			return true
		}
		return false
	})
	return first, err
}

func (r *run) awaitEnd(id sectionID, within time.Duration) (*event, error) {
	var end *event
	_, err := r.st.await(within, func(sn snapshot) bool {
		end = sn.find(func(e *event) bool { return e.Op == "end" && e.section() == id })
		return end != nil
	})
	return end, err
}

// progress summarises the store for a failure message.
func (r *run) progress() string {
	sn := r.st.snap()
	reads := sn.count(func(e *event) bool { return e.Op == "read" })
	acc := sn.count(func(e *event) bool { return e.Op == "write" && e.Accepted })
	ref := sn.count(func(e *event) bool { return e.Op == "write" && !e.Accepted })
	last := "none"
	if n := len(sn.events); n > 0 {
		e := sn.events[n-1]
		last = fmt.Sprintf("%s by worker %d token %d %v ago", e.Op, e.Worker, e.Token, time.Since(e.At).Round(time.Millisecond))
	}
	var logs []string
	for _, w := range r.workers {
		logs = append(logs, fmt.Sprintf("--- worker %d:\n%s", w.id, w.tail()))
	}
	return fmt.Sprintf("%d sections, %d accepted, %d refused writes; last event: %s\n%s", reads, acc, ref, last, strings.Join(logs, "\n"))
}

// recordGrant waits for the lock to be granted again after a fault, to
// another worker than victim, and records how long it took from from.
func (r *run) recordGrant(what string, victim int, at, from time.Time) *event {
	r.t.Helper()
	within := r.sc.grantBound() + phaseWithin
	g, err := r.awaitGrant(from, victim, within)
	rec := faultRec{what: what, victim: victim, at: at, from: from}
	if err != nil {
		r.fail("%s: the lock was not granted again within %v: %s", what, within, r.progress())
		r.faults = append(r.faults, rec)
		return nil
	}
	rec.grant = g.At
	r.faults = append(r.faults, rec)
	return g
}

// Verdicts.

// row is one line of the table.
type row struct {
	fault, backend                                  string
	cycles, accepted, refused, overlaps, outOfOrder int
	longest, bound, exit                            time.Duration
	ok                                              bool
	notes                                           string
}

var (
	tableMu sync.Mutex
	table   []row
)

func printTable(w io.Writer) {
	tableMu.Lock()
	defer tableMu.Unlock()
	if len(table) == 0 {
		return
	}
	fmt.Fprintf(w, "\nfenced counter under faults (ttl %v unless noted, %d workers; unavailable: longest time from the fault, or the server's return,\n"+
		"to the next grant, judged against bound: how long the server may keep a dead holder's lease (the ttl; 2x a 10s ttl on Consul) + %v;\n"+
		"exit: slowest worker exit once told to stop)\n",
		ttl, nWorkers, grantSlack)
	fmt.Fprintf(w, "%-12s %-16s %7s %8s %7s %8s %10s %12s %7s %8s  %-6s %s\n",
		"fault", "backend", "cycles", "accepted", "refused", "overlaps", "tokens-ooo", "unavailable", "bound", "exit", "result", "notes")
	for _, x := range table {
		res := "ok"
		if !x.ok {
			res = "FAIL"
		}
		fmt.Fprintf(w, "%-12s %-16s %7d %8d %7d %8d %10d %12v %7v %8v  %-6s %s\n",
			x.fault, x.backend, x.cycles, x.accepted, x.refused, x.overlaps, x.outOfOrder,
			x.longest.Round(time.Millisecond), x.bound, x.exit.Round(time.Millisecond), res, x.notes)
	}
}

// section is what the store saw of one critical section.
type section struct {
	id       sectionID
	token    uint64
	entered  time.Time
	readAt   time.Time
	end      time.Time // the last accepted write
	accepted int
}

func (r *run) judge() {
	sn := r.st.snap()
	x := row{fault: r.sc.fault, backend: r.sc.backend, exit: r.slowestExit, bound: r.sc.grantBound()}
	secs := map[sectionID]*section{}
	get := func(e *event) *section {
		s := secs[e.section()]
		if s == nil {
			s = &section{id: e.section(), token: e.Token, entered: e.Entered}
			secs[e.section()] = s
		}
		return s
	}
	var reads []*event
	var prevTok uint64
	var prevSec sectionID
	anyAccepted := false
	losses := 0
	for i := range sn.events {
		e := &sn.events[i]
		switch e.Op {
		case "read":
			x.cycles++
			get(e).readAt = e.At
			reads = append(reads, e)
		case "write":
			if !e.Accepted {
				x.refused++
				continue
			}
			x.accepted++
			s := get(e)
			s.accepted++
			s.end = e.At
			// The fence itself: no accepted token below the previous
			// holder's, and no token accepted from two sections.
			if anyAccepted && (e.Token < prevTok || e.Token == prevTok && e.section() != prevSec) {
				x.outOfOrder++
				r.fail("accepted write of worker %d section %d with token %d after token %d of worker %d section %d",
					e.Worker, e.Section, e.Token, prevTok, prevSec.Worker, prevSec.Section)
			}
			prevTok, prevSec, anyAccepted = e.Token, e.section(), true
		case "end":
			if e.CauseLost {
				losses++
			}
		}
	}
	if sn.counter != int64(x.accepted) {
		r.fail("counter is %d after %d accepted writes: increments were lost", sn.counter, x.accepted)
	}

	// Exclusion: sections that both got writes accepted must not overlap.
	var done []*section
	for _, s := range secs {
		if s.accepted > 0 {
			done = append(done, s)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i].entered.Before(done[j].entered) })
	var last *section
	for _, s := range done {
		if last != nil && s.entered.Before(last.end) {
			x.overlaps++
			if x.overlaps <= 5 {
				r.fail("overlap: worker %d section %d (token %d) entered %v before worker %d section %d (token %d) made its last accepted write",
					s.id.Worker, s.id.Section, s.token, last.end.Sub(s.entered), last.id.Worker, last.id.Section, last.token)
			}
		}
		if last == nil || s.end.After(last.end) {
			last = s
		}
	}

	// Tokens in grant order: a section must carry a higher token than every
	// section that had already started (read) when it was granted.
	sort.Slice(reads, func(i, j int) bool { return reads[i].At.Before(reads[j].At) })
	prefixMax := make([]uint64, len(reads))
	for i, e := range reads {
		prefixMax[i] = e.Token
		if i > 0 && prefixMax[i-1] > e.Token {
			prefixMax[i] = prefixMax[i-1]
		}
	}
	regressions := 0
	var firstRegression string
	for _, s := range secs {
		// Its own read comes after it entered, unless the clocks of two
		// processes disagree: it is never an earlier grant.
		bound := s.entered
		if !s.readAt.IsZero() && s.readAt.Before(bound) {
			bound = s.readAt
		}
		i := sort.Search(len(reads), func(i int) bool { return !reads[i].At.Before(bound) })
		if i > 0 && prefixMax[i-1] >= s.token {
			regressions++
			if firstRegression == "" {
				firstRegression = fmt.Sprintf("worker %d section %d granted token %d after token %d had been granted",
					s.id.Worker, s.id.Section, s.token, prefixMax[i-1])
			}
		}
	}
	switch {
	case regressions > 0 && r.sc.fenceLost:
		r.note("%d grants with an old token (the fence counter was lost with the server's data)", regressions)
	case regressions > 0:
		x.outOfOrder += regressions
		r.fail("%d grants whose token was not above an earlier grant's; first: %s", regressions, firstRegression)
	}

	for _, f := range r.faults {
		if f.grant.IsZero() {
			continue
		}
		gap := f.grant.Sub(f.from)
		if gap > x.longest {
			x.longest = gap
		}
		if gap > x.bound {
			r.fail("%s: the lock was granted again only %v after %s, more than %v (the lease kept %v + %v)",
				f.what, gap.Round(time.Millisecond), map[bool]string{true: "the fault", false: "the server came back"}[f.from.Equal(f.at)],
				x.bound, x.bound-grantSlack, grantSlack)
		}
	}
	if losses > 0 {
		r.note("%d sections lost their lock", losses)
	}
	x.ok = len(r.failures) == 0
	x.notes = strings.Join(r.notes, "; ")
	r.row = x
	if r.selfTest {
		return
	}
	if !x.ok {
		r.keepHistory(sn)
	}
	tableMu.Lock()
	table = append(table, x)
	tableMu.Unlock()
}

// keepHistory writes the store's history, one JSON event a line, where it
// outlives the test, for a failure to be read in full.
func (r *run) keepHistory(sn snapshot) {
	f, err := os.CreateTemp("", fmt.Sprintf("warden-faults-%s-%s-*.jsonl", r.sc.fault, r.sc.backend))
	if err != nil {
		r.t.Logf("keeping the history: %v", err)
		return
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, e := range sn.events {
		enc.Encode(e)
	}
	for _, w := range r.workers {
		fmt.Fprintf(f, "{\"worker_log\":%d,\"text\":%q}\n", w.id, w.tail())
	}
	r.t.Logf("history of the store and the workers' logs: %s", f.Name())
}

// Shared servers (scripts/services.sh), for the faults that touch no server.

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func sharedAddrs(t *testing.T, env, def string) []string {
	return strings.Split(drivertest.Addr(t, env, def), ",")
}

func withParam(dsn, kv string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&" + kv
	}
	return dsn + "?" + kv
}

// shared returns the spec of backend on the shared servers.
func shared(backend string) func(t *testing.T, r *run) backendSpec {
	return func(t *testing.T, r *run) backendSpec {
		switch backend {
		case "redis", "redis-fair":
			return backendSpec{Kind: "redis", Addrs: sharedAddrs(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379"), Fair: backend == "redis-fair"}
		case "redlock":
			return backendSpec{Kind: "redlock", Addrs: sharedAddrs(t, "WARDEN_REDLOCK_ADDRS",
				"127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384")}
		case "etcd":
			return backendSpec{Kind: "etcd", Addrs: sharedAddrs(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379")}
		case "zookeeper":
			return backendSpec{Kind: "zk", Addrs: sharedAddrs(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181"), Root: zkRoot(r)}
		case "sqlite":
			return backendSpec{Kind: "sqlite", Table: sqlTable(r),
				DSN: filepath.Join(r.dir, "locks.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"}
		case "postgres-listen", "postgres-poll":
			dsn := envOr("WARDEN_POSTGRES_DSN", "postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable")
			sqlReachable(t, "postgres", "WARDEN_POSTGRES_DSN", dsn)
			return backendSpec{Kind: "postgres", DSN: withParam(dsn, "connect_timeout=2"), Table: sqlTable(r), Listen: backend == "postgres-listen"}
		case "mariadb":
			dsn := envOr("WARDEN_MYSQL_DSN", "warden:warden@tcp(127.0.0.1:13306)/warden?parseTime=true")
			sqlReachable(t, "mariadb", "WARDEN_MYSQL_DSN", dsn)
			return backendSpec{Kind: "mariadb", DSN: withParam(dsn, "timeout=2s"), Table: sqlTable(r)}
		case "consul":
			return backendSpec{Kind: "consul", Addrs: sharedAddrs(t, "WARDEN_CONSUL_ADDR", "127.0.0.1:18500")}
		}
		t.Fatalf("no shared backend %q", backend)
		return backendSpec{}
	}
}

func sqlReachable(t *testing.T, kind, env, dsn string) {
	db, err := openGorm(backendSpec{Kind: kind, DSN: dsn})
	if err == nil {
		pool, _ := db.DB()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = pool.PingContext(ctx)
		cancel()
		pool.Close()
	}
	if err != nil {
		drivertest.Unreachable(t, env, dsn, err)
	}
}

func zkRoot(r *run) string {
	return "/warden-faults/" + strings.ReplaceAll(strings.TrimSuffix(r.prefix, ":"), ":", "-")
}

func sqlTable(r *run) string {
	return "warden_faults_" + strings.NewReplacer("-", "_", ":", "").Replace(strings.TrimPrefix(r.prefix, "wf-"))
}

// Scenarios.

var sharedBackends = []string{"redis", "redis-fair", "redlock", "etcd", "zookeeper", "sqlite", "postgres-listen", "postgres-poll", "mariadb", "consul"}

// onShared is a scenario on backend's shared server, with Consul's leases
// on Consul.
func onShared(backend, fault string, inject func(*run)) scenario {
	sc := scenario{backend: backend, fault: fault, setup: shared(backend), inject: inject}
	if backend == "consul" {
		sc = consulLeases(sc)
	}
	return sc
}

func scenarios() []scenario {
	var out []scenario
	for _, b := range sharedBackends {
		out = append(out, onShared(b, "kill-9", injectKill))
	}
	for _, b := range sharedBackends {
		out = append(out, onShared(b, "sigstop", injectStop))
	}
	for _, b := range sharedBackends {
		if b != "sqlite" { // a file has no connection to cut
			out = append(out, onShared(b, "proxy", injectPartition))
		}
	}
	out = append(out,
		scenario{backend: "redis", fault: "restart", setup: ownRedis(portRedis, false), inject: injectRestart},
		scenario{backend: "redis-aof", fault: "restart", setup: ownRedis(portRedisAOF, true), inject: injectRestart},
		scenario{backend: "etcd", fault: "restart", setup: ownEtcd, inject: injectRestart},
		scenario{backend: "zookeeper", fault: "restart", setup: ownZK, inject: injectRestart},
		scenario{backend: "postgres-listen", fault: "restart", setup: ownPostgres(true), inject: injectRestart},
		scenario{backend: "postgres-async", fault: "restart", setup: ownPostgres(false), inject: injectRestart,
			fenceLost: true, lossy: true},
		// A Consul server keeps its Raft log in its data directory:
		// sessions, keys and the index come back with it.
		consulLeases(scenario{backend: "consul", fault: "restart", setup: ownConsul(false), inject: injectRestart}),
		// A dev agent keeps nothing: see injectWipe.
		consulLeases(scenario{backend: "consul-dev", fault: "restart", setup: ownConsul(true), inject: injectWipe,
			fenceLost: true}),
		scenario{backend: "redis-aof", fault: "outage", setup: ownRedis(portRedisAOF, true), inject: injectOutage},
		scenario{backend: "etcd", fault: "outage", setup: ownEtcd, inject: injectOutage},
		scenario{backend: "zookeeper", fault: "outage", setup: ownZK, inject: injectOutage},
		scenario{backend: "postgres-listen", fault: "outage", setup: ownPostgres(true), inject: injectOutage},
		consulLeases(scenario{backend: "consul", fault: "outage", setup: ownConsul(false), inject: injectOutage}),
		scenario{backend: "redlock-aof", fault: "2-of-5-down", setup: ownRedlock(true), inject: injectMinorityDown},
		scenario{backend: "redlock-aof", fault: "3-of-5-down", setup: ownRedlock(true), inject: injectMajorityDown},
		// Masters without persistence come back empty: safe for exclusion
		// while fewer than a majority forget their votes at once, or when
		// they stay away longer than the TTL, as here; tokens must still
		// grow (the docs' clock floor).
		scenario{backend: "redlock-empty", fault: "2-of-5-down", setup: ownRedlock(false), inject: injectMinorityDown},
		scenario{backend: "redlock-empty", fault: "3-of-5-down", setup: ownRedlock(false), inject: injectMajorityDown},
	)
	return out
}

func ownRedis(port int, aof bool) func(t *testing.T, r *run) backendSpec {
	return func(t *testing.T, r *run) backendSpec {
		s := redisServer(t, port, aof)
		r.servers = append(r.servers, s)
		return backendSpec{Kind: "redis", Addrs: []string{s.addr}}
	}
}

func ownRedlock(aof bool) func(t *testing.T, r *run) backendSpec {
	return func(t *testing.T, r *run) backendSpec {
		spec := backendSpec{Kind: "redlock"}
		for i := range 5 {
			s := redisServer(t, portRedlockBase+i, aof)
			r.servers = append(r.servers, s)
			spec.Addrs = append(spec.Addrs, s.addr)
		}
		return spec
	}
}

func ownEtcd(t *testing.T, r *run) backendSpec {
	s := etcdServer(t)
	r.servers = append(r.servers, s)
	return backendSpec{Kind: "etcd", Addrs: []string{s.addr}}
}

func ownZK(t *testing.T, r *run) backendSpec {
	s := zkServer(t)
	r.servers = append(r.servers, s)
	return backendSpec{Kind: "zk", Addrs: []string{s.addr}, Root: zkRoot(r)}
}

func ownPostgres(syncCommit bool) func(t *testing.T, r *run) backendSpec {
	return func(t *testing.T, r *run) backendSpec {
		s, dsn := postgresServer(t, syncCommit)
		r.servers = append(r.servers, s)
		return backendSpec{Kind: "postgres", DSN: dsn, Table: sqlTable(r), Listen: true}
	}
}

// Faults.

// injectKill kills the holder with SIGKILL inside its section: the lock must
// come back to another worker once the lease expires, with a higher token.
func injectKill(r *run) {
	for attempt := 1; ; attempt++ {
		first, err := r.awaitMarked(markedHold)
		if err != nil {
			r.fail("no section to aim the kill at: %s", r.progress())
			return
		}
		victim := r.workers[first.Worker]
		at := time.Now()
		victim.kill9()
		if n := len(r.st.snap().writes(first.section())); n > 1 && attempt < 3 {
			// The kill came after the section: aim again.
			r.spawn(victim.spec)
			continue
		}
		r.recordGrant("kill -9 of the holder", victim.id, at, at)
		// The workload goes on with K workers.
		r.spawn(victim.spec)
		return
	}
}

// injectStop stops the holder with SIGSTOP inside its section, until
// another worker holds the lock and has written with a newer token, then
// resumes it: its late write must be refused by the fence, and it must learn
// that its lock was lost.
func injectStop(r *run) {
	for attempt := 1; ; attempt++ {
		first, err := r.awaitMarked(markedHold)
		if err != nil {
			r.fail("no section to aim the SIGSTOP at: %s", r.progress())
			return
		}
		victim := r.workers[first.Worker]
		id := first.section()
		at := time.Now()
		victim.cmd.Process.Signal(syscall.SIGSTOP)
		if n := len(r.st.snap().writes(id)); n > 1 {
			victim.cmd.Process.Signal(syscall.SIGCONT)
			if attempt < 3 {
				continue
			}
			r.fail("SIGSTOP missed the section three times")
			return
		}
		if r.recordGrant("SIGSTOP of the holder", victim.id, at, at) == nil {
			victim.cmd.Process.Signal(syscall.SIGCONT)
			return
		}
		// Resume it only once the fence has moved past its token.
		_, err = r.st.await(phaseWithin, func(sn snapshot) bool {
			return sn.find(func(e *event) bool { return e.Op == "write" && e.Accepted && e.Token > first.Token }) != nil
		})
		if err != nil {
			victim.cmd.Process.Signal(syscall.SIGCONT)
			r.fail("no newer write after the SIGSTOP: %s", r.progress())
			return
		}
		stopped := time.Since(at)
		victim.cmd.Process.Signal(syscall.SIGCONT)
		end, err := r.awaitEnd(id, phaseWithin)
		if err != nil {
			r.fail("worker %d did not finish its section within %v of SIGCONT: %s", victim.id, phaseWithin, victim.tail())
			return
		}
		ws := r.st.snap().writes(id)
		switch {
		case len(ws) < 2:
			r.fail("worker %d made no write after SIGCONT", victim.id)
		case ws[1].Accepted:
			r.fail("the late write of worker %d (token %d) was accepted after %v stopped", victim.id, first.Token, stopped.Round(time.Millisecond))
		}
		if !end.CauseLost || !end.DoLost {
			r.fail("worker %d was stopped %v, past its lease, and resumed: its section's context cause wraps ErrLockLost: %v; Do's error wraps it: %v (%q)",
				victim.id, stopped.Round(time.Millisecond), end.CauseLost, end.DoLost, end.DoErr)
		}
		r.note("stopped %v; late write refused; loss reported %v after SIGCONT", stopped.Round(time.Millisecond), end.At.Sub(at.Add(stopped)).Round(time.Millisecond))
		return
	}
}

// injectPartition blackholes worker 0's connections (through its proxies)
// while it lingers in its section far past the TTL: its section must be
// cancelled with ErrLockLost before anyone else is granted the lock. Then
// the proxies reset every connection and relay again, and the worker must
// come back.
func injectPartition(r *run) {
	const victim = 0
	mark := time.Now()
	r.st.markWorker(victim, 2*r.sc.leaseTTL())
	var first *event
	_, err := r.st.await(phaseWithin, func(sn snapshot) bool {
		// The section that got the mark is the victim's first to start
		// after it; the victim may have been finishing another.
		read := sn.find(func(e *event) bool { return e.Op == "read" && e.Worker == victim && e.At.After(mark) })
		if read == nil {
			return false
		}
		if ws := sn.writes(read.section()); len(ws) > 0 {
			first = &ws[0]
		}
		return first != nil
	})
	if err != nil {
		r.fail("worker %d never held the lock: %s", victim, r.progress())
		return
	}
	at := time.Now()
	for _, p := range r.proxies {
		p.Blackhole()
	}
	g := r.recordGrant("partition of the holder", victim, at, at)
	end, err := r.awaitEnd(first.section(), 2*r.sc.leaseTTL()+releaseTimeout+phaseWithin)
	switch {
	case err != nil:
		r.fail("worker %d did not end its section after the partition: %s", victim, r.workers[victim].tail())
	case !end.CauseLost || end.LostAt.IsZero():
		r.fail("worker %d, partitioned while lingering in its section, was not told while in it: context cause wraps ErrLockLost: %v, Do's error %q",
			victim, end.CauseLost, end.DoErr)
	case g != nil && !end.LostAt.Before(g.Entered):
		r.fail("worker %d's section was cancelled %v after worker %d was granted the lock", victim, end.LostAt.Sub(g.Entered), g.Worker)
	case g != nil:
		r.note("cut-off holder cancelled %v before the next grant", g.Entered.Sub(end.LostAt).Round(time.Millisecond))
	}
	if g == nil {
		return
	}
	// Heal once the others have taken turns without the victim.
	_, err = r.st.await(phaseWithin, func(sn snapshot) bool {
		return sn.count(func(e *event) bool { return e.Op == "read" && e.Worker != victim && e.At.After(at) }) >= 2
	})
	if err != nil {
		r.fail("the others made no progress during the partition: %s", r.progress())
	}
	healed := time.Now()
	for _, p := range r.proxies {
		p.Reset()
	}
	back, err := r.awaitGrant(healed, -1, phaseWithin)
	for err == nil && back.Worker != victim {
		back, err = r.awaitGrant(back.At, -1, phaseWithin)
	}
	if err != nil {
		r.fail("worker %d was not granted the lock within %v of the partition healing: %s", victim, phaseWithin, r.workers[victim].tail())
		return
	}
	r.note("cut-off worker back %v after the heal", back.At.Sub(healed).Round(time.Millisecond))
}

// injectRestart crashes the (only) server while a holder is inside its
// section and starts it again on the same data.
func injectRestart(r *run) {
	srv := r.servers[0]
	if _, err := r.awaitMarked(markedHold); err != nil {
		r.fail("no section to aim the restart at: %s", r.progress())
		return
	}
	at, back, ok := r.restart(srv)
	if !ok {
		return
	}
	r.noteHolders("once back")
	r.note("%s down %v", srv.name, back.Sub(at).Round(time.Millisecond))
	r.recordGrant("restart of "+srv.name, -1, at, back)
}

// restart crashes srv and starts it again at once; it returns when srv went
// down and when it answered again, or false after failing r.
func (r *run) restart(srv *server) (at, back time.Time, ok bool) {
	at = time.Now()
	if err := srv.crash(); err != nil {
		r.fail("crash %s: %v", srv.name, err)
		return at, back, false
	}
	if err := srv.start(90 * time.Second); err != nil {
		r.fail("restart %s: %v", srv.name, err)
		return at, back, false
	}
	return at, time.Now(), true
}

// injectWipe crashes a Consul dev agent while a holder lingers in its
// section, and starts it again at once. A dev agent keeps everything in
// memory, so it comes back empty: no session, no key, and a Raft index, the
// source of the tokens, started over. No lock survives its server
// forgetting it: what is judged is that the holder, whose session is gone,
// is told that its lock is lost while still in its section; that the lock
// is granted again within the bound once the agent is back; and that the
// fence refuses every write with the new, lower tokens (grants with an
// older token than before the crash are reported, not failed, as fenceLost
// says) until the index passes the old ones. Whether the holder was told
// before another worker was granted the lock is noted: with the lease
// forgotten by the server nothing orders the two but the speed at which
// each process finds its session gone, and only the fence protects the data.
func injectWipe(r *run) {
	srv := r.servers[0]
	first, err := r.awaitMarked(2 * r.sc.leaseTTL())
	if err != nil {
		r.fail("no section to aim the restart at: %s", r.progress())
		return
	}
	at, back, ok := r.restart(srv)
	if !ok {
		return
	}
	r.note("%s down %v, back empty", srv.name, back.Sub(at).Round(time.Millisecond))
	g := r.recordGrant("restart of "+srv.name+" (state lost)", first.Worker, at, back)
	end, err := r.awaitEnd(first.section(), 2*r.sc.leaseTTL()+releaseTimeout+phaseWithin)
	switch {
	case err != nil:
		r.fail("the holder did not end its section after %s came back empty: %s", srv.name, r.progress())
	case !end.CauseLost || end.LostAt.IsZero():
		r.fail("holder worker %d was not told while in its section that its lock was lost with %s back empty: cause lost %v, Do's error %q",
			end.Worker, srv.name, end.CauseLost, end.DoErr)
	case g == nil:
	case end.LostAt.Before(g.Entered):
		r.note("holder told %v after the agent was back, %v before worker %d was granted the lock",
			end.LostAt.Sub(back).Round(time.Millisecond), g.Entered.Sub(end.LostAt).Round(time.Millisecond), g.Worker)
	default:
		r.note("holder told %v after the agent was back, %v AFTER worker %d was granted the lock (only the fence stood between them)",
			end.LostAt.Sub(back).Round(time.Millisecond), end.LostAt.Sub(g.Entered).Round(time.Millisecond), g.Worker)
	}
}

// noteHolders notes what holds or waits for the lock on the backend when,
// so that a slow recovery says what it waited for.
func (r *run) noteHolders(when string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	left, err := leftovers(ctx, r.spec, r.prefix)
	switch {
	case err != nil:
		r.note("state %s: %v", when, err)
	case len(left) > 0:
		r.note("state %s: %s", when, strings.Join(left, ", "))
	}
}

// injectOutage crashes the server while a holder lingers in its section,
// and starts it again only once the holder has been told that its lock is
// lost, which must happen while it is still in its section: a holder cannot
// keep a lease it cannot renew. Nobody may be granted the lock meanwhile.
func injectOutage(r *run) {
	srv := r.servers[0]
	first, err := r.awaitMarked(2 * r.sc.leaseTTL())
	if err != nil {
		r.fail("no section to aim the outage at: %s", r.progress())
		return
	}
	at := time.Now()
	if err := srv.crash(); err != nil {
		r.fail("crash %s: %v", srv.name, err)
		return
	}
	end, err := r.awaitEnd(first.section(), 2*r.sc.leaseTTL()+releaseTimeout+phaseWithin)
	switch {
	case err != nil:
		r.fail("the holder did not end its section with %s down: %s", srv.name, r.progress())
	case !end.CauseLost || end.LostAt.IsZero():
		r.fail("holder worker %d was not told while in its section that its lock was lost with %s down: cause lost %v, Do's error %q",
			end.Worker, srv.name, end.CauseLost, end.DoErr)
	default:
		r.note("holder told %v after the crash", end.LostAt.Sub(at).Round(time.Millisecond))
	}
	restarting := time.Now()
	if err := srv.start(90 * time.Second); err != nil {
		r.fail("restart %s: %v", srv.name, err)
		return
	}
	back := time.Now()
	r.noteHolders("once back")
	if late := r.st.snap().find(func(e *event) bool {
		return e.Op == "read" && e.Entered.After(at.Add(time.Second)) && e.At.Before(restarting)
	}); late != nil {
		r.fail("worker %d was granted the lock %v after %s went down, while it was down",
			late.Worker, late.Entered.Sub(at).Round(time.Millisecond), srv.name)
	}
	r.note("%s down %v", srv.name, back.Sub(at).Round(time.Millisecond))
	r.recordGrant("outage of "+srv.name, -1, at, back)
}

// injectMinorityDown crashes two of the five RedLock masters: the lock must
// keep working; then they come back (on their append-only files).
func injectMinorityDown(r *run) {
	at := time.Now()
	for _, s := range r.servers[3:] {
		s.crash()
	}
	r.recordGrant("2 of 5 masters down", -1, at, at)
	if _, err := r.awaitAccepted(at, phaseWrites); err != nil {
		r.fail("no progress with 3 of 5 masters: %s", r.progress())
	}
	for _, s := range r.servers[3:] {
		if err := s.start(30 * time.Second); err != nil {
			r.fail("restart %s: %v", s.name, err)
		}
	}
}

// injectMajorityDown crashes three of the five masters while a holder
// lingers in its section: the holder must be told it lost the lock, nobody
// may be granted it while they are down, and it must be granted again soon
// after they come back.
func injectMajorityDown(r *run) {
	first, err := r.awaitMarked(2 * r.sc.leaseTTL())
	if err != nil {
		r.fail("no section to aim the outage at: %s", r.progress())
		return
	}
	at := time.Now()
	for _, s := range r.servers[2:] {
		s.crash()
	}
	// The one thing that can be watched only over a span of time: no grant
	// while the majority is down. The span covers every lease that was
	// alive at the crash.
	if end, err := r.awaitEnd(first.section(), 2*r.sc.leaseTTL()+releaseTimeout+phaseWithin); err != nil {
		r.fail("the holder did not end its section: %s", r.progress())
	} else if !end.CauseLost || end.LostAt.IsZero() {
		r.fail("holder worker %d was not told while in its section that its lock was lost with 3 of 5 masters down: cause lost %v, Do's error %q",
			end.Worker, end.CauseLost, end.DoErr)
	}
	if probeErr := probeRedlock(r); probeErr == nil {
		r.fail("a lock was granted to the test process with 3 of 5 masters down")
	} else {
		r.note("refused with 3 of 5 down: %v", probeErr)
	}
	quiet := at.Add(ttl + grantSlack)
	time.Sleep(time.Until(quiet))
	// A round that had its votes before the crash may still be returning
	// for a moment; none can start and win after it.
	late := r.st.snap().find(func(e *event) bool { return e.Op == "read" && e.Entered.After(at.Add(time.Second)) })
	if late != nil {
		r.fail("worker %d was granted the lock (token %d) %v after 3 of 5 masters went down",
			late.Worker, late.Token, late.Entered.Sub(at).Round(time.Millisecond))
	}
	for _, s := range r.servers[2:] {
		if err := s.start(30 * time.Second); err != nil {
			r.fail("restart %s: %v", s.name, err)
			return
		}
	}
	back := time.Now()
	r.note("3 masters down %v", back.Sub(at).Round(time.Millisecond))
	r.recordGrant("3 of 5 masters back", -1, at, back)
}

// probeRedlock asks for the lock from the test process, waiting a second for
// it, and returns nil only if it was granted.
func probeRedlock(r *run) error {
	locker, _, closeNodes, err := openLocker(r.spec, ttl)
	if err != nil {
		r.fail("probe: %v", err)
		return err
	}
	defer closeNodes()
	g, err := guard.New(locker, guard.WithTTL(ttl), guard.WithPrefix(r.prefix), guard.WithReleaseTimeout(releaseTimeout))
	if err != nil {
		r.fail("probe: %v", err)
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ran := false
	err = g.Do(ctx, lockKey, func(context.Context, *guard.Lock) error {
		ran = true
		return nil
	}, guard.WaitAtMost(time.Second))
	if ran {
		return nil
	}
	if err == nil {
		err = errors.New("Do returned nil without running its function")
	}
	return err
}

package scheduler_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/scheduler"
)

// The environment of a scheduler process started by startProcess.
const (
	helperEnv   = "WARDEN_SCHEDULER_HELPER"
	lockEnv     = "WARDEN_SCHEDULER_LOCK"
	storeEnv    = "WARDEN_SCHEDULER_STORE"
	jobEnv      = "WARDEN_SCHEDULER_JOB"
	outEnv      = "WARDEN_SCHEDULER_OUT"
	instanceEnv = "WARDEN_SCHEDULER_INSTANCE"
	workEnv     = "WARDEN_SCHEDULER_WORK"
	ttlEnv      = "WARDEN_SCHEDULER_TTL"
	runForEnv   = "WARDEN_SCHEDULER_RUN_FOR"
	// Optional: the election of leader mode, and the job's schedule
	// (default "@every 1s").
	leaderEnv = "WARDEN_SCHEDULER_LEADER"
	everyEnv  = "WARDEN_SCHEDULER_EVERY"
	// Optional: CatchUp with this MisfireAfter.
	catchUpEnv = "WARDEN_SCHEDULER_CATCH_UP"
	// Optional: the anchor of @every schedules (Unix nanoseconds), the
	// scheduler's clock's offset from the real one, and WaitForLock.
	anchorEnv = "WARDEN_SCHEDULER_ANCHOR"
	skewEnv   = "WARDEN_SCHEDULER_SKEW"
	waitEnv   = "WARDEN_SCHEDULER_WAIT"
)

// TestHelperScheduler is not a test: it is the body of a scheduler process
// that the multi-process tests start from this test binary. It runs a job
// on "@every 1s" under the lock backend and with the slot store its
// environment names, and appends a "start|end slot instance unix-nanos
// term token" line to its output file around each run, a "released" one
// when the run's lock context ends, a "began" one with the time the run
// began (before it took the lock), a "held slot instance from to 0" one
// for each run that found the lock held (from and to bound its try), and
// an "outcome slot instance from to outcome reason" one for each run that
// did not run the job; and a "ready 0 instance unix-nanos 0 0" one once
// its scheduler has started.
func TestHelperScheduler(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("the body of a scheduler process; run by the multi-process tests")
	}
	dur := func(env string) time.Duration {
		d, err := time.ParseDuration(os.Getenv(env))
		if err != nil {
			t.Fatalf("%s: %v", env, err)
		}
		return d
	}
	var term, token uint64 // of the run being noted
	out, err := os.OpenFile(os.Getenv(outEnv), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	instance := os.Getenv(instanceEnv)
	note := func(what string, slot time.Time) {
		// One write per line, on an O_APPEND file: the parent may read it
		// at any moment, or after a kill -9.
		fmt.Fprintf(out, "%s %d %s %d %d %d\n", what, slot.UnixNano(), instance, time.Now().UnixNano(), term, token)
	}
	g := newGuard(t, specLocker(t, os.Getenv(lockEnv)), guard.WithTTL(dur(ttlEnv)))
	observe := func(r scheduler.RunRecord) {
		switch {
		case r.Outcome == scheduler.Ran:
			fmt.Fprintf(out, "began %d %s %d 0 0\n", r.Slot.UnixNano(), instance, r.Started.UnixNano())
		case r.Reason == "lock held":
			fmt.Fprintf(out, "held %d %s %d %d 0\n", r.Slot.UnixNano(), instance, r.Started.UnixNano(), r.Finished.UnixNano())
		}
		if r.Outcome != scheduler.Ran {
			fmt.Fprintf(out, "outcome %d %s %d %d %s %q\n", r.Slot.UnixNano(), instance, r.Started.UnixNano(), r.Finished.UnixNano(), r.Outcome, r.Reason)
		}
	}
	opts := []scheduler.Option{scheduler.WithInstance(instance), scheduler.WithLogger(slog.New(slog.DiscardHandler)),
		scheduler.WithSlotStore(specStore(t, os.Getenv(storeEnv))), scheduler.WithRunObserver(observe)}
	if e := os.Getenv(leaderEnv); e != "" {
		opts = append(opts, scheduler.WithLeaderElection(e))
	}
	if e := os.Getenv(anchorEnv); e != "" {
		ns, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", anchorEnv, err)
		}
		opts = append(opts, scheduler.WithAnchor(time.Unix(0, ns)))
	}
	if os.Getenv(skewEnv) != "" {
		skew := dur(skewEnv)
		opts = append(opts, scheduler.WithClock(func() time.Time { return time.Now().Add(skew) }))
	}
	every := cmp.Or(os.Getenv(everyEnv), "@every 1s")
	s, err := scheduler.New(g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	work := dur(workEnv)
	var jobOpts []scheduler.JobOption
	if os.Getenv(catchUpEnv) != "" {
		jobOpts = append(jobOpts, scheduler.CatchUp(), scheduler.MisfireAfter(dur(catchUpEnv)))
	}
	if os.Getenv(waitEnv) != "" {
		jobOpts = append(jobOpts, scheduler.WaitForLock(dur(waitEnv)))
	}
	err = s.Add(every, os.Getenv(jobEnv), func(ctx context.Context) error {
		run, _ := scheduler.RunFrom(ctx)
		term, token = run.Term, run.Lock.Token()
		note("start", run.Slot)
		context.AfterFunc(run.Lock.Context(), func() {
			fmt.Fprintf(out, "released %d %s %d 0 0\n", run.Slot.UnixNano(), instance, time.Now().UnixNano())
		})
		t := time.NewTimer(work)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		note("end", run.Slot)
		return nil
	}, jobOpts...)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	fmt.Fprintf(out, "ready 0 %s %d 0 0\n", instance, time.Now().UnixNano())
	time.Sleep(dur(runForEnv)) // the process's lifetime, not a wait for an outcome
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

type process struct {
	instance string
	out      string
	cmd      *exec.Cmd
	done     chan error
}

// startProcess starts a scheduler process running job on c's lock backend
// and slot store.
func startProcess(t *testing.T, c cluster, job, instance string, work, ttl, runFor time.Duration, env ...string) *process {
	t.Helper()
	p := &process{instance: instance, out: filepath.Join(t.TempDir(), instance+".log"), done: make(chan error, 1)}
	p.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperScheduler$", "-test.count=1")
	p.cmd.Env = append(os.Environ(), helperEnv+"=1", lockEnv+"="+c.lockSpec, storeEnv+"="+c.storeSpec, jobEnv+"="+job,
		outEnv+"="+p.out, instanceEnv+"="+instance,
		workEnv+"="+work.String(), ttlEnv+"="+ttl.String(), runForEnv+"="+runFor.String())
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// kill9 kills the process named instance with SIGKILL (no release, no
// goodbye), waits for it to die, and returns when it did.
func kill9(t *testing.T, ps []*process, instance string) time.Time {
	t.Helper()
	for _, p := range ps {
		if p.instance == instance {
			if err := p.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-p.done
			p.done <- nil
		}
	}
	return time.Now()
}

// procRun is one run of the job as a process reported it.
type procRun struct {
	slot       time.Time
	instance   string
	start, end time.Time // end is zero when the process died mid-run
	term       uint64    // in leader mode
	token      uint64
	// began is when the run began, before it took the lock, and released
	// when its lock context ended; zero when the process died first.
	began, released time.Time
}

// heldTry is a run that found the job's lock held, trying between from and
// to.
type heldTry struct {
	slot     time.Time
	instance string
	from, to time.Time
}

// readRuns parses the output files of ps.
func readRuns(t *testing.T, ps []*process) []procRun {
	t.Helper()
	runs, _ := readOutput(t, ps)
	return runs
}

// readOutput parses the output files of ps: the runs, and the tries that
// found the lock held.
func readOutput(t *testing.T, ps []*process) ([]procRun, []heldTry) {
	t.Helper()
	var runs []procRun
	var held []heldTry
	for _, p := range ps {
		f, err := os.Open(p.out)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		open := map[int64]int{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) != 6 {
				continue // a line cut short by kill -9
			}
			slot, err1 := strconv.ParseInt(fields[1], 10, 64)
			at, err2 := strconv.ParseInt(fields[3], 10, 64)
			term, err3 := strconv.ParseUint(fields[4], 10, 64)
			token, err4 := strconv.ParseUint(fields[5], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
				continue
			}
			i, ok := open[slot]
			switch fields[0] {
			case "start":
				open[slot] = len(runs)
				runs = append(runs, procRun{slot: time.Unix(0, slot), instance: fields[2], start: time.Unix(0, at), term: term, token: token})
			case "end":
				if ok {
					runs[i].end = time.Unix(0, at)
				}
			case "began":
				if ok {
					runs[i].began = time.Unix(0, at)
				}
			case "released":
				if ok {
					runs[i].released = time.Unix(0, at)
				}
			case "held":
				// The fifth field is the end of the try.
				held = append(held, heldTry{slot: time.Unix(0, slot), instance: fields[2], from: time.Unix(0, at), to: time.Unix(0, int64(term))})
			}
		}
		f.Close()
	}
	slices.SortFunc(runs, func(a, b procRun) int { return a.start.Compare(b.start) })
	return runs, held
}

// allReady returns when the last of ps noted its scheduler started, and
// whether all have.
func allReady(t *testing.T, ps []*process) (time.Time, bool) {
	t.Helper()
	var last time.Time
	for _, p := range ps {
		data, err := os.ReadFile(p.out)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		var at int64
		for line := range strings.Lines(string(data)) {
			if f := strings.Fields(line); len(f) == 6 && f[0] == "ready" {
				at, _ = strconv.ParseInt(f[3], 10, 64)
			}
		}
		if at == 0 {
			return time.Time{}, false
		}
		if r := time.Unix(0, at); r.After(last) {
			last = r
		}
	}
	return last, true
}

// notes returns the lines of ps's output files about slot, for a failure's
// message.
func notes(t *testing.T, ps []*process, slot time.Time) string {
	t.Helper()
	var b strings.Builder
	key := strconv.FormatInt(slot.UnixNano(), 10)
	for _, p := range ps {
		data, err := os.ReadFile(p.out)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(data)) {
			if f := strings.Fields(line); len(f) > 1 && f[1] == key {
				b.WriteString("\n\t" + strings.TrimSpace(line))
			}
		}
	}
	return b.String()
}

// heldByRun reports whether a run of another slot held the lock at some
// moment of h: it began before h ended (its job's start, if the process
// died before noting when it began) and its lock was released after h
// began, or never (its process died holding it).
func heldByRun(h heldTry, runs []procRun) bool {
	for _, r := range runs {
		began := cmp.Or(r.began, r.start)
		if !r.slot.Equal(h.slot) && began.Before(h.to) && (r.released.IsZero() || r.released.After(h.from)) {
			return true
		}
	}
	return false
}

// processBackends keeps the backends the multi-process tests run on: those
// another process can reach, less MySQL, whose lock and store code is the
// SQL backend's already run on SQLite and PostgreSQL here and in-process in
// the cluster tests.
func processBackends(b backend) bool { return b.name != "memory" && b.name != "mysql" }

// TestThreeProcessesOncePerSlot: three scheduler processes on "@every 1s"
// for ten seconds run each slot exactly once and never overlap, save the
// slots whose claimant found the lock still held by another run, late on a
// loaded machine (see TestThreeSchedulersOncePerSlot).
func TestThreeProcessesOncePerSlot(t *testing.T) {
	t.Parallel()
	eachBackend(t, processBackends, func(t *testing.T, b backend) {
		c := b.setup(t)
		job := uniqueName("tick")
		var ps []*process
		for _, inst := range []string{"p1", "p2", "p3"} {
			ps = append(ps, startProcess(t, c, job, inst, 50*time.Millisecond, c.ttl, 10*time.Second))
		}
		for _, p := range ps {
			select {
			case err := <-p.done:
				p.done <- err
				if err != nil {
					t.Fatalf("process %s: %v", p.instance, err)
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("process %s still running", p.instance)
			}
		}
		runs, held := readOutput(t, ps)
		for _, h := range held {
			if !heldByRun(h, runs) {
				t.Errorf("slot %v: %s found the lock held from %v to %v while no run held it", h.slot, h.instance, h.from, h.to)
			}
		}
		perSlot := map[time.Time]int{}
		by := map[string]int{}
		for i, r := range runs {
			perSlot[r.slot]++
			by[r.instance]++
			if r.end.IsZero() {
				t.Errorf("run of slot %v on %s never ended", r.slot, r.instance)
			}
			if i > 0 && r.start.Before(runs[i-1].end) {
				t.Errorf("run of slot %v on %s overlaps the run of slot %v on %s", r.slot, r.instance, runs[i-1].slot, runs[i-1].instance)
			}
		}
		for s, n := range perSlot {
			if n != 1 {
				t.Errorf("slot %v ran %d times", s, n)
			}
		}
		overruns := 0
		for i := 1; i < len(runs); i++ {
			if d := runs[i].slot.Sub(runs[i-1].slot); d <= 0 || d%time.Second != 0 {
				t.Errorf("slot %v follows %v: %v apart", runs[i].slot, runs[i-1].slot, d)
				continue
			}
			for s := runs[i-1].slot.Add(time.Second); s.Before(runs[i].slot); s = s.Add(time.Second) {
				if !slices.ContainsFunc(held, func(h heldTry) bool { return h.slot.Equal(s) && heldByRun(h, runs) }) {
					t.Errorf("slot %v did not run, and no process found the lock held by another run", s)
					continue
				}
				overruns++
			}
		}
		if len(runs)+overruns < 8 {
			t.Errorf("%d runs and %d slots skipped while the lock was held in ten seconds, want about ten slots", len(runs), overruns)
		}
		t.Logf("%d slots run once each, by process: %v; %d skipped by all while an earlier run held the lock", len(runs), by, overruns)
	})
}

// TestKilledProcessSlotsRunElsewhere kills a scheduler process with kill -9
// in the middle of a run; once its lock's ttl has passed, the next slots
// run on the other processes.
func TestKilledProcessSlotsRunElsewhere(t *testing.T) {
	t.Parallel()
	eachBackend(t, processBackends, func(t *testing.T, b backend) {
		c := b.setup(t)
		job := uniqueName("killed")
		ttl := c.ttl
		var ps []*process
		// Runs last until the test ends, so the victim is still running
		// when the kill lands however late that is: at load ~26 a run of
		// ttl+2s once ended first.
		for _, inst := range []string{"k1", "k2", "k3"} {
			ps = append(ps, startProcess(t, c, job, inst, 30*time.Second, ttl, 60*time.Second))
		}
		var victim procRun
		waitFor(t, "a process to start a run", 20*time.Second, func() bool {
			runs := readRuns(t, ps)
			if len(runs) > 0 {
				victim = runs[0]
			}
			return len(runs) > 0
		})
		killed := kill9(t, ps, victim.instance)
		var next procRun
		waitFor(t, "a run on another process", 20*time.Second, func() bool {
			for _, r := range readRuns(t, ps) {
				if r.instance != victim.instance {
					next = r
					return true
				}
			}
			return false
		})
		for _, r := range readRuns(t, ps) {
			if r.instance == victim.instance && r.slot.Equal(victim.slot) && !r.end.IsZero() {
				t.Fatalf("the run of slot %v ended before the kill: not a kill mid-run", victim.slot)
			}
		}
		if next.start.Before(killed) {
			t.Errorf("slot %v ran on %s at %v, while %s still held the lock (killed at %v)",
				next.slot, next.instance, next.start, victim.instance, killed)
		}
		// The lease outlives its holder by at most ttl; the next slot after
		// that comes within a second.
		if d := next.start.Sub(killed); d > ttl+time.Second+2*time.Second {
			t.Errorf("next run %v after the kill, want within ttl %v + the interval (+ slack)", d, ttl)
		}
		if !next.slot.After(victim.slot) {
			t.Errorf("slot %v ran after the killed run of slot %v", next.slot, victim.slot)
		}
		t.Logf("killed %s mid-run of slot %v; slot %v ran on %s %v after the kill",
			victim.instance, victim.slot.Format(time.TimeOnly), next.slot.Format(time.TimeOnly), next.instance, next.start.Sub(killed))
	})
}

// TestKilledLeaderIsReplaced runs three scheduler processes in leader mode
// and kills the leader with kill -9: another process leads, and runs the
// job, within the lock's ttl and a few seconds of slack (plus one interval
// of the job), under a greater term, and no two terms ever run at once.
func TestKilledLeaderIsReplaced(t *testing.T) {
	t.Parallel()
	eachBackend(t, processBackends, func(t *testing.T, b backend) {
		c := b.setup(t)
		job, election := uniqueName("led"), uniqueName("election")
		const interval = 200 * time.Millisecond
		env := []string{leaderEnv + "=" + election, everyEnv + "=@every " + interval.String()}
		var ps []*process
		for _, inst := range []string{"l1", "l2", "l3"} {
			ps = append(ps, startProcess(t, c, job, inst, 20*time.Millisecond, c.ttl, 60*time.Second, env...))
		}
		var leader procRun
		waitFor(t, "a leader to run the job", 30*time.Second, func() bool {
			runs := readRuns(t, ps)
			if len(runs) >= 3 {
				leader = runs[len(runs)-1]
			}
			return len(runs) >= 3
		})
		killed := kill9(t, ps, leader.instance)
		var next procRun
		waitFor(t, "another process to lead", 30*time.Second, func() bool {
			for _, r := range readRuns(t, ps) {
				// Under load leadership may have moved before the kill:
				// an earlier leader's runs are not the replacement.
				if r.instance != leader.instance && !r.start.Before(killed) {
					next = r
					return true
				}
			}
			return false
		})
		// The slack is for 2 busy cores (a CI run saw 2.6s with a 600ms ttl
		// at load 13); a leader found only by some slower path (a poll, a
		// session timeout) would still show.
		if d := next.start.Sub(killed); d > c.ttl+3*time.Second+interval {
			t.Errorf("the new leader's first run came %v after the kill, want within ttl %v + 3s + the interval", d, c.ttl)
		}
		if next.term <= leader.term {
			t.Errorf("new term %d after term %d", next.term, leader.term)
		}
		// Let the new terms run a while, then judge every run. Under load a
		// lease may lapse and leadership move again, so the runs are
		// counted by term, not by the first new leader.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			n, seen := 0, map[string]int{}
			for _, r := range readRuns(t, ps) {
				seen[fmt.Sprintf("%s term %d", r.instance, r.term)]++
				if r.term > leader.term {
					n++
				}
			}
			if n >= 5 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out after 30s waiting for the fifth run under a new term; runs by process and term: %v", seen)
			}
		}
		runs := readRuns(t, ps)
		for i := 1; i < len(runs); i++ {
			prev, r := runs[i-1], runs[i]
			if r.term == 0 {
				t.Fatalf("run %+v without a term", r)
			}
			if r.term < prev.term {
				t.Errorf("term %d ran at %v, after term %d had started", r.term, r.start, prev.term)
			}
			if r.term != prev.term && (prev.end.IsZero() && r.start.Before(killed) || !prev.end.IsZero() && r.start.Before(prev.end)) {
				t.Errorf("terms %d (on %s) and %d (on %s) ran at once", prev.term, prev.instance, r.term, r.instance)
			}
		}
		t.Logf("killed leader %s (term %d); %s led from term %d, first run %v after the kill",
			leader.instance, leader.term, next.instance, next.term, next.start.Sub(killed).Round(time.Millisecond))
	})
}

// TestCatchUpAfterKill kills, with kill -9, the process running a slot of a
// CatchUp job: another process runs that slot again, exactly once, with a
// greater fencing token, and every other slot runs once.
func TestCatchUpAfterKill(t *testing.T) {
	t.Parallel()
	catchUpAfterKill(t)
}

// TestCatchUpAfterKillingTheLeader is TestCatchUpAfterKill in leader mode:
// the process killed is the leader, and the one that leads next runs the
// slot again. No follower watched the slot's claim, and it was never run
// again.
func TestCatchUpAfterKillingTheLeader(t *testing.T) {
	t.Parallel()
	catchUpAfterKill(t, leaderEnv+"="+uniqueName("election"))
}

// catchUpAfterKill is the body of TestCatchUpAfterKill, its processes
// started with env besides the job's.
func catchUpAfterKill(t *testing.T, env ...string) {
	eachBackend(t, processBackends, func(t *testing.T, b backend) {
		c := b.setup(t)
		job := uniqueName("catchup")
		// The window must hold the dead claim's lapse (one lease, 2s or the
		// ttl, after its last renewal), the watchers' poll (half a lease)
		// and the dead lock's expiry.
		every := max(6*time.Second, 3*c.ttl)
		misfire := every - 500*time.Millisecond
		// Long enough to be killed mid-run, short enough to fit the
		// catch-up run into the slot's window after the dead claim lapses.
		work := 1500 * time.Millisecond
		env := append([]string{everyEnv + "=@every " + every.String(), catchUpEnv + "=" + misfire.String()}, env...)
		var ps []*process
		for _, inst := range []string{"c1", "c2", "c3"} {
			ps = append(ps, startProcess(t, c, job, inst, work, c.ttl, 60*time.Second, env...))
		}
		// The victim's slot must be one every process fires: a process
		// that was still starting then (one was, once, at load ~18)
		// never sees it, and nobody is left to catch it up. Its timer loop
		// starts a moment after it notes it is ready.
		var victim procRun
		waitFor(t, "a run of a slot every process was up for", 60*time.Second, func() bool {
			ready, ok := allReady(t, ps)
			if !ok {
				return false
			}
			for _, r := range readRuns(t, ps) {
				if r.slot.After(ready.Add(time.Second)) {
					victim = r
					return true
				}
			}
			return false
		})
		killed := kill9(t, ps, victim.instance)
		var again procRun
		for deadline := time.Now().Add(30 * time.Second); again.start.IsZero(); time.Sleep(10 * time.Millisecond) {
			for _, r := range readRuns(t, ps) {
				if r.slot.Equal(victim.slot) && r.instance != victim.instance {
					again = r
				}
			}
			if again.start.IsZero() && time.Now().After(deadline) {
				t.Fatalf("timed out after 30s waiting for the killed slot %v (killed at %v) to run again; the processes noted:%s",
					victim.slot, killed, notes(t, ps, victim.slot))
			}
		}
		if again.start.Before(killed) {
			t.Fatalf("slot %v caught up at %v, before its runner was killed at %v", victim.slot, again.start, killed)
		}
		if again.token <= victim.token {
			t.Errorf("caught-up run's token %d, not greater than the killed run's %d", again.token, victim.token)
		}
		// Two more slots, then every slot but the killed one ran once, and
		// the killed one exactly twice (the dead run and its catch-up).
		waitFor(t, "two slots after the killed one", 30*time.Second, func() bool {
			n := 0
			for _, r := range readRuns(t, ps) {
				if r.slot.After(victim.slot) && !r.end.IsZero() {
					n++
				}
			}
			return n >= 2
		})
		perSlot := map[time.Time]int{}
		for _, r := range readRuns(t, ps) {
			perSlot[r.slot]++
		}
		for slot, n := range perSlot {
			want := 1
			if slot.Equal(victim.slot) {
				want = 2
			}
			if n != want {
				t.Errorf("slot %v ran %d times, want %d", slot, n, want)
			}
		}
		t.Logf("killed %s mid-run of slot %v; %s caught it up %v after the kill (tokens %d then %d)",
			victim.instance, victim.slot.Format(time.TimeOnly), again.instance, again.start.Sub(killed).Round(time.Millisecond), victim.token, again.token)
	})
}

// TestPausedWaiterDoesNotRunACaughtUpSlot: a CatchUp job's lock is held by
// someone else at its slot. Process A claims the slot, waits for the lock,
// and is paused (SIGSTOP) past its claim's lease; B catches the lapsed slot
// up and waits for the lock too, which the holder lets go 6 s after the
// slot: B runs the slot and completes it. A, resumed at 8.5 s, takes the
// lock B let go and must find its claim gone, and not run the slot again.
// Redis only: the timeline needs the 2 s claim lease of a sub-2 s lock TTL,
// which ZooKeeper's session and etcd's minimum do not give.
func TestPausedWaiterDoesNotRunACaughtUpSlot(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(b backend) bool { return b.name == "redis" }, func(t *testing.T, b backend) {
		c := b.setup(t)
		job := uniqueName("paused-waiter")
		holder, err := c.node(t, guard.WithTTL(2*time.Second)).Lock(context.Background(), job)
		if err != nil {
			t.Fatal(err)
		}
		// Far enough ahead for both processes to start on a loaded machine.
		slot := time.Now().Add(8 * time.Second).Truncate(time.Second)
		env := []string{everyEnv + "=@every 1h", catchUpEnv + "=30s", waitEnv + "=20s",
			anchorEnv + "=" + strconv.FormatInt(slot.UnixNano(), 10)}
		runFor := time.Until(slot) + 15*time.Second
		a := startProcess(t, c, job, "A", 200*time.Millisecond, c.ttl, runFor, env...)
		// B's clock is behind: A claims first.
		bp := startProcess(t, c, job, "B", 200*time.Millisecond, c.ttl, runFor, append(env, skewEnv+"=-300ms")...)
		ps := []*process{a, bp}
		if ready, ok := allReadyBy(t, ps, slot); !ok || ready.After(slot) {
			t.Fatalf("the processes were not both ready before the slot at %v", slot)
		}
		time.Sleep(time.Until(slot.Add(500 * time.Millisecond)))
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(slot.Add(6 * time.Second)))
		if err := holder.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(slot.Add(8500 * time.Millisecond)))
		if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if err := <-p.done; err != nil {
				t.Errorf("process %s: %v", p.instance, err)
			}
			p.done <- nil
		}
		var who []string
		for _, r := range readRuns(t, ps) {
			if r.slot.Equal(slot) {
				who = append(who, fmt.Sprintf("%s at +%v", r.instance, r.start.Sub(slot).Round(time.Millisecond)))
			}
		}
		t.Logf("slot %v (A paused +0.5s to +8.5s, lock held until +6s): ran on %v; the processes noted:%s", slot.Format(time.TimeOnly), who, notes(t, ps, slot))
		if len(who) != 1 {
			t.Errorf("the slot ran %d times (%v), want once", len(who), who)
		}
	})
}

// allReadyBy waits until every process of ps has noted its scheduler
// started, or until deadline, and returns when the last did.
func allReadyBy(t *testing.T, ps []*process, deadline time.Time) (time.Time, bool) {
	t.Helper()
	for {
		ready, ok := allReady(t, ps)
		if ok || time.Now().After(deadline) {
			return ready, ok
		}
		time.Sleep(20 * time.Millisecond)
	}
}

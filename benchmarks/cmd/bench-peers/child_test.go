package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// Every field of a record that crosses from a group's process to the
// parent is in its fields list, so none arrives zero.
func TestFieldsListEveryField(t *testing.T) {
	for _, r := range []fielded{&cycleKey{}, &cycleResult{}, &renewKey{}, &renewResult{}, &idemKey{}, &idemResult{}, &tableState{}} {
		if got, want := len(r.fields()), reflect.TypeOf(r).Elem().NumField(); got != want {
			t.Errorf("%T lists %d fields of its %d", r, got, want)
		}
	}
}

// What a group's process hands off is what the parent takes over: every
// map, NaN and infinities included, the lock tables, failures, retries and
// the servers' versions.
func TestHandoffRoundTrip(t *testing.T) {
	from := &bench{res: newResults(), machine: machine{servers: []string{"Redis 7.4.1"}}}
	from.res.addCycle(cycleKey{"contended", 8, time.Millisecond, "bsm"}, cycleResult{
		ops: 1234.5, p50: 0.25, p99: 3, hand50: math.NaN(), hand99: math.Inf(1), back: 0.125,
		cmds: 4, trips: 2, idle: math.Inf(-1), foreign: true, errs: 3, acquiring: 2469, held: 1.0625,
	})
	from.res.addCycle(cycleKey{"contended", 8, time.Millisecond, "bsm"}, cycleResult{ops: 1, hand50: math.NaN()})
	from.res.addCycle(cycleKey{"uncontended", 1, 0, "warden-redis"}, cycleResult{ops: 9000})
	from.res.addRenewal(1000, "warden-redis", renewResult{trips: 1.5, cmds: 1000, heap: 412, stack: math.NaN(), lost: 2, foreign: true})
	from.res.idem[idemKey{"redislock.Store (Redis)", "replay"}] = []idemResult{{rps: 5000, p50: 0.5, p99: 2, trips: 1, cmds: math.NaN(), foreign: true}}
	from.res.failures = []string{"contended 8, bsm, repetition 1: boom"}
	from.res.retries = 4
	from.tables = []tableState{{phase: "vacuumed", table: wardenTable, live: 1, dead: 2, updates: 3, hot: 4, vacuums: 5, heap: 6, index: 7}}
	data, err := from.handOff()
	if err != nil {
		t.Fatal(err)
	}
	to := &bench{res: newResults()}
	if err := to.merge(data); err != nil {
		t.Fatal(err)
	}
	// %v prints NaN as NaN, where reflect.DeepEqual finds NaN unequal to
	// itself; it prints maps sorted by key.
	for name, pair := range map[string][2]any{
		"cycles":   {from.res.cycles, to.res.cycles},
		"renewals": {from.res.renewals, to.res.renewals},
		"idem":     {from.res.idem, to.res.idem},
		"tables":   {from.tables, to.tables},
		"failures": {from.res.failures, to.res.failures},
		"retries":  {from.res.retries, to.res.retries},
		"servers":  {from.machine.servers, to.machine.servers},
	} {
		if want, got := fmt.Sprintf("%+v", pair[0]), fmt.Sprintf("%+v", pair[1]); got != want {
			t.Errorf("%s: took over\n%s\nwant\n%s", name, got, want)
		}
	}
	if err := to.merge([]byte(`{"cycles":[{"key":["uncontended",1,0],"values":[]}]}`)); err == nil {
		t.Error("a key missing a field was taken over")
	}
}

// The parent's report shows the figures of two groups' processes side by
// side, with what each process saw of its servers.
func TestReportMergesGroups(t *testing.T) {
	s, err := parseSettings([]string{"-quick", "-pairs", "postgres,memory", "-scenarios", "uncontended"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	handOff := func(group string, fill func(*bench)) string {
		b, err := newBench(s, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		b.groups = []string{group}
		fill(b)
		data, err := b.handOff()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), group+".json")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	uncontended := func(b *bench, id string, ops float64) {
		b.res.addCycle(cycleKey{"uncontended", 1, 0, id}, cycleResult{ops: ops, p50: 0.1, p99: 0.2, hand50: math.NaN(), hand99: math.NaN(), back: math.NaN(), cmds: math.NaN(), trips: math.NaN(), idle: math.NaN(), held: math.NaN()})
	}
	pg := handOff("postgres", func(b *bench) {
		b.machine.servers = []string{"PostgreSQL 17.2"}
		uncontended(b, "warden-pg", 4500)
		uncontended(b, "raw-pg", 5000)
		b.tables = []tableState{{phase: "vacuumed", table: wardenTable}, {phase: "vacuumed", table: rawTable}}
		b.res.retries = 2
		b.res.failures = []string{"uncontended 1, raw tuned, repetition 1: pg gone"}
	})
	mem := handOff("memory", func(b *bench) {
		uncontended(b, "warden-memory", 2e6)
		uncontended(b, "sync-mutex", 4e6)
		b.res.retries = 1
	})
	b, err := newBench(s, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{pg, mem} {
		if err := b.takeOver(path); err != nil {
			t.Fatal(err)
		}
	}
	b.groups = []string{"postgres", "memory"}
	report := b.markdown()
	for _, want := range []string{
		"| warden sqllock (PostgreSQL) vs raw INSERT … ON CONFLICT (pgx) | 4500 / 5000 (0.90×)",
		"| warden memory vs sync.Mutex | 2.00M / 4.00M (0.50×)",
		"- Server: PostgreSQL 17.2,",
		"| vacuumed | " + wardenTable + " |",
		"| vacuumed | " + rawTable + " |",
		"this run took 3 measurement(s) again",
		"- uncontended 1, raw tuned, repetition 1: pg gone",
		"Each group of pairs (postgres, memory) was measured in a process of its own",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(report)
	}
}

// A group whose process fails (here, its server does not answer) is left
// out of the report, named there with why; with -strict it fails the run.
func TestFailedGroupIsLeftOut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes of the program")
	}
	t.Setenv("WARDEN_REDIS_ADDR", "127.0.0.1:1") // nothing listens on port 1
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := []string{"-quick", "-pairs", "redis,memory", "-scenarios", "uncontended", "-out", dir}
	var out strings.Builder
	err := run(ctx, append(args, "-strict=false"), &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(md)
	for _, want := range []string{"- Left out: redis (", "127.0.0.1:1", "| warden memory vs sync.Mutex |"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	err = run(ctx, append(args, "-strict"), io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "redis: ") {
		t.Errorf("-strict with redis down: %v, want the run to fail naming redis", err)
	}
}

// signalWriter is a log that closes seen once it has been sent want.
type signalWriter struct {
	mu   sync.Mutex
	sb   strings.Builder
	want string
	seen chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	had := strings.Contains(w.sb.String(), w.want)
	w.sb.Write(p)
	if !had && strings.Contains(w.sb.String(), w.want) {
		close(w.seen)
	}
	return len(p), nil
}

// An interrupted parent interrupts the group's process, which stops its
// measurement itself (and would remove what it left on the servers)
// rather than being killed.
func TestInterruptStopsGroupProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes of the program")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	runCtx, interrupt := context.WithCancel(ctx)
	log := &signalWriter{want: "bench-peers run", seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		// Repetitions enough to outlast the test.
		done <- run(runCtx, []string{"-pairs", "memory", "-scenarios", "uncontended", "-reps", "1000000", "-d", "10ms", "-slices", "1", "-out", t.TempDir()}, log)
	}()
	select {
	case <-log.seen:
	case err := <-done:
		t.Fatalf("the run ended before it was interrupted: %v", err)
	case <-ctx.Done():
		t.Fatal("the group's process never started measuring")
	}
	interrupt()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatal("the run did not end once interrupted")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v, want context.Canceled", err)
	}
	// The process's own last words, not a kill's.
	if want := "(memory: context canceled (its process: exit status 1))"; !strings.Contains(err.Error(), want) {
		t.Errorf("interrupted run: %v, want the group's process to have stopped itself: %s", err, want)
	}
}

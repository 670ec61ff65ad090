package main

import (
	"context"
	"image/png"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/consul/api"
)

// TestMain lets this test binary serve as a group's process: the parent
// runs os.Executable, which under go test is this binary.
func TestMain(m *testing.M) {
	if _, _, _, ok := childArgs(os.Args[1:]); ok {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestQuickRun runs the whole program in -quick mode against the servers of
// scripts/services.sh, and checks that it measured everything and wrote a
// readable report and chart. Figures are never asserted: they depend on the
// machine.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for tens of seconds against live servers")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	err := run(ctx, []string{"-quick", "-out", dir}, &out)
	t.Log(out.String())
	if err != nil {
		if strings.Contains(err.Error(), "no group was measured") && os.Getenv("WARDEN_REQUIRE_SERVERS") != "1" {
			t.Skipf("no server: %v (start them with scripts/services.sh up)", err)
		}
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(md)
	for _, want := range []string{"# Benchmarks", "## Machine", "logical CPUs", "go1.", "each group of pairs measured in a process of its own"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(report, "## PostgreSQL lock tables") {
		// Aged tables are vacuumed before they are measured (vacuumPG).
		for _, table := range []string{wardenTable, rawTable} {
			if want := "| vacuumed | " + table + " |"; !strings.Contains(report, want) {
				t.Errorf("report lacks %q", want)
			}
		}
	}
	if i := strings.Index(report, "## Failures"); i >= 0 {
		t.Errorf("measurements failed:\n%s", report[i:])
	}
	if strings.Contains(out.String(), "leaving out") && os.Getenv("WARDEN_REQUIRE_SERVERS") != "1" {
		t.Logf("some groups were left out: their servers did not answer")
	}
	f, err := os.Open(filepath.Join(dir, "bench-peers.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("chart is %v", b)
	}
}

func TestSettings(t *testing.T) {
	s, err := parseSettings([]string{"-quick", "-reps", "2", "-pairs", "memory,redis"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if s.reps != 2 || s.uncontended >= time.Second || len(s.contenders) != 2 {
		t.Errorf("quick defaults not applied around an explicit flag: %+v", s)
	}
	if strings.Join(s.groups, ",") != "redis,memory" {
		t.Errorf("groups %v, want the known order", s.groups)
	}
	if len(s.holds) != 2 || s.holds[0] != 0 || s.holds[1] != time.Millisecond || s.churn == 0 {
		t.Errorf("holds %v and churn %d, want 0 and 1ms, and some churn", s.holds, s.churn)
	}
	for _, bad := range [][]string{{"-pairs", "mongo"}, {"-contenders", "0"}, {"-reps", "0"}, {"stray"}, {"-holds", "-1ms"}, {"-holds", "soon"}, {"-churn", "-1"}, {"-slices", "0"}, {"-d", "5ms", "-slices", "6"}} {
		if _, err := parseSettings(bad, &strings.Builder{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestStatistics(t *testing.T) {
	if q := quantile([]float64{5, 1, 4, 2, 3}, 0.5); q != 3 {
		t.Errorf("p50 = %v", q)
	}
	if q := quantile([]float64{1, 2, 3, 4, 100}, 0.99); q != 100 {
		t.Errorf("p99 = %v", q)
	}
	m := median([]float64{3, math.NaN(), 1, 2}, func(v float64) float64 { return v })
	if m != 2 {
		t.Errorf("median = %v", m)
	}
	if !math.IsNaN(ratio(1, 0)) || ratio(3, 2) != 1.5 {
		t.Error("ratio")
	}
}

func TestChartWithoutData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.png")
	d := chartData{series: []string{"a", "b"}, rows: []chartRow{
		{label: "x vs y", values: []float64{0.004, 3000}},
		{label: "z vs w …", values: []float64{math.NaN(), 1}},
	}}
	if err := writeChart(path, d, "title"); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatal(err)
	}
}

func TestFormatting(t *testing.T) {
	for _, c := range []struct {
		r    float64
		want string
	}{{0.0001, "0.0001×"}, {0.069, "0.069×"}, {0.42, "0.42×"}, {31.4, "31.4×"}, {2116, "2116×"}, {math.NaN(), "—"}} {
		if got := fmtRatio(c.r); got != c.want {
			t.Errorf("fmtRatio(%v) = %q, want %q", c.r, got, c.want)
		}
	}
	for in, want := range map[string]string{"-out": "-out", "..": "..", "a b": "'a b'", "it's": `'it'\''s'`, "": "''"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestCountedTakesTheWorseSetting: the ratio that counts against a peer is
// the worse of warden's ratios against its settings, and says which.
func TestCountedTakesTheWorseSetting(t *testing.T) {
	b := &bench{
		s:      settings{scenarios: []string{"uncontended", "contended"}, contenders: []int{8}, holds: []time.Duration{0}},
		groups: []string{"redis"},
		subj:   map[string]*subject{},
		res:    newResults(),
	}
	for _, sub := range []*subject{
		{id: "warden-redis", label: "w"}, {id: "warden-redis-fair", label: "wf"},
		bsmSubject(b, false), bsmSubject(b, true),
		redsyncSubject(b, "redsync", []string{"x"}, false), redsyncSubject(b, "redsync", []string{"x"}, true),
		rawRedisSubject(b, false), rawRedisSubject(b, true),
	} {
		b.subj[sub.id] = sub
	}
	ops := map[string]float64{"warden-redis": 100, "bsm": 80, "bsm-tuned": 125, "redsync": 50, "redsync-tuned": 50, "raw-redis": 90, "raw-redis-tuned": 100, "warden-redis-fair": 10}
	for id, v := range ops {
		b.res.addCycle(cycleKey{"contended", 8, 0, id}, cycleResult{ops: v})
	}
	fams := b.families("contended")
	var bsm *family
	for i := range fams {
		if fams[i].warden == "warden-redis" && fams[i].peer == "bsm" {
			bsm = &fams[i]
		}
	}
	if bsm == nil || len(bsm.pairs) != 2 {
		t.Fatalf("no bsm family with both settings in %+v", fams)
	}
	c := b.counted(*bsm, "contended", 8, 0)
	if c.ratio != 0.8 || c.setting != "tuned" {
		t.Errorf("counted %+v, want 0.8 against the tuned peer", c)
	}
	if got := b.countedCell(*bsm, column{scenario: "contended", n: 8}); !strings.Contains(got, "✗") {
		t.Errorf("cell %q does not mark 0.8 below the target", got)
	}
	var raw family
	for _, f := range fams {
		if f.peer == "raw-redis" {
			raw = f
		}
	}
	if c := b.counted(raw, "contended", 8, 0); c.ratio != 1 || !strings.Contains(b.countedCell(raw, column{scenario: "contended", n: 8}), "✓") {
		t.Errorf("raw floor: %+v, want 1.0 and the target 0.95 met", c)
	}
}

// TestConsulTransport: every request of a Consul client counts once, and a
// request sent while the transport is bound ends with the bound context,
// which is how a waiter of api.Lock is let go at the end of a window.
func TestConsulTransport(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("index") {
			select { // a blocking query with nothing to report
			case <-hang:
			case <-r.Context().Done():
			}
			return
		}
		w.Write([]byte(`"127.0.0.1:8300"`))
	}))
	defer srv.Close()
	m := newMeter(countHTTP, nil, nil)
	var src consulSources
	c, tr, err := newConsulClient(strings.TrimPrefix(srv.URL, "http://"), m, src.next())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	if _, err := c.Status().Leader(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr.bind(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := c.KV().Get("k", &api.QueryOptions{WaitIndex: 7, WaitTime: time.Hour})
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a bound blocking query outlived its context")
		}
	case <-time.After(time.Minute):
		t.Fatal("a bound blocking query was not cut when its context ended")
	}
	tr.unbind()
	if _, err := c.Status().Leader(); err != nil {
		t.Errorf("unbound request: %v", err)
	}
	if got := m.trips.Load(); got != 3 {
		t.Errorf("counted %d requests, want 3", got)
	}
	if a, b := src.next(), src.next(); a.Equal(b) || !a.IsLoopback() || !b.IsLoopback() {
		t.Errorf("source addresses %v and %v: want two loopback addresses", a, b)
	}
}

// TestConsulRenewalWindow: on a server with a shortest TTL, the renewal
// scenario runs at that TTL at least and counts whole TTLs.
func TestConsulRenewalWindow(t *testing.T) {
	b := &bench{s: settings{renewTTL: 3 * time.Second, periods: 2}}
	consul := &subject{minTTL: 10 * time.Second}
	if got := b.renewTTL(consul); got != 10*time.Second {
		t.Errorf("TTL %v, want 10s", got)
	}
	if got := b.renewPeriods(consul); got != 3 {
		t.Errorf("%d periods, want 3", got)
	}
	if got, p := b.renewTTL(&subject{}), b.renewPeriods(&subject{}); got != 3*time.Second || p != 2 {
		t.Errorf("without a shortest TTL: %v and %d periods, want -ttl and -periods", got, p)
	}
}

// TestRenewersJudgeLosses: a per-lock renewal loop counts a lock lost when
// the server says so or when nothing was answered for a TTL, not for a
// failed attempt, and never for meeting the lock's own release.
func TestRenewersJudgeLosses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period, ttl = time.Second, 3 * time.Second
		r := newRenewers()
		r.track(4)
		var calls [4]atomic.Int64
		// 0: an attempt fails (it waited a period for a connection, say),
		// the next is answered within the TTL: held.
		r.start(0, period, ttl, func(context.Context) error {
			if calls[0].Add(1) == 1 {
				return context.DeadlineExceeded
			}
			return nil
		})
		// 1: never answered: lost once a TTL has passed.
		r.start(1, period, ttl, func(context.Context) error { return context.DeadlineExceeded })
		// 2: the server says it is gone: lost.
		r.start(2, period, ttl, func(context.Context) error { return errNotHeld })
		// 3: gone because it is being released: no loss.
		r.start(3, period, ttl, func(context.Context) error {
			if calls[3].Add(1) == 2 {
				r.releasing(3)
				return errNotHeld
			}
			return nil
		})
		time.Sleep(5 * period)
		synctest.Wait()
		r.released(3, true)
		r.halt()
		for i, want := range []int32{held, lost, lost, releasing} {
			if got := r.state[i].Load(); got != want {
				t.Errorf("lock %d: state %d, want %d", i, got, want)
			}
		}
		if n := r.lost(); n != 2 {
			t.Errorf("lost %d, want 2", n)
		}
		if r.releasing(1) != true || r.releasing(0) {
			t.Error("releasing does not tell a lost lock from a held one")
		}
		r.released(0, false)
		if n := r.lost(); n != 3 {
			t.Errorf("a release that finds the lock gone: lost %d, want 3", n)
		}
	})
}

// turnsWorker notes which subject each cycle was made for, one entry per
// run of cycles.
type turnsWorker struct {
	id    string
	turns *[]string
}

func (w turnsWorker) cycle(context.Context, string, func()) error {
	if n := len(*w.turns); n == 0 || (*w.turns)[n-1] != w.id {
		*w.turns = append(*w.turns, w.id)
	}
	return nil
}

func (turnsWorker) close() {}

// The uncontended windows of one repetition are cut into slices that run
// in turns, the subjects' order rotated each turn, and each subject's
// result is its slices together.
func TestUncontendedRunsInTurns(t *testing.T) {
	var turns []string
	newSubject := func(id string) *subject {
		return &subject{id: id, label: id, fixture: func(context.Context, *meter) (fixture, error) {
			return perWorker(func(context.Context) (worker, error) { return turnsWorker{id, &turns}, nil }), nil
		}}
	}
	b := &bench{s: settings{uncontended: 30 * time.Millisecond, slices: 3}, log: io.Discard, id: "turns", res: &results{}}
	subs, rs, err := b.uncontended(context.Background(), []*subject{newSubject("a"), newSubject("b")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Warm-ups a, b; turns a, b; b, a; a, b: runs of one subject merge.
	if got := strings.Join(turns, ","); got != "a,b,a,b,a,b" {
		t.Errorf("cycles ran in the order %s, want warm-ups a, b, then turns a, b; b, a; a, b", got)
	}
	if len(subs) != 2 || len(rs) != 2 {
		t.Fatalf("%d subjects measured, want 2", len(subs))
	}
	for i, r := range rs {
		if r.acquiring == 0 || r.ops <= 0 {
			t.Errorf("%s: %+v, want its slices' cycles", subs[i].id, r)
		}
	}
}

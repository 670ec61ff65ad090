// Command bench-peers measures warden's Guard beside the lock libraries its
// users would otherwise pick, against live servers, in one run, and writes
// the figures to BENCHMARKS.md with a PNG chart of the main ratios.
//
// Usage:
//
//	cd benchmarks && go run ./cmd/bench-peers [flags]
//
// The servers are found through the variables scripts/services.sh env
// prints (WARDEN_REDIS_ADDR, WARDEN_REDLOCK_ADDRS, WARDEN_ETCD_ENDPOINTS,
// WARDEN_ZK_SERVERS, WARDEN_POSTGRES_DSN, WARDEN_CONSUL_ADDR), with the same
// defaults. Each group of pairs is measured in a process of its own (this
// program again), one group after another, and the parent writes their
// figures into one report. A group whose servers do not answer, or whose
// process fails, is left out of the report, or fails the run with -strict.
// Run with -h for the flags; -quick is a smoke run of about two minutes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "bench-peers:", err)
		os.Exit(1)
	}
}

// settings is what the flags decide.
type settings struct {
	quick       bool
	groups      []string
	scenarios   []string
	reps        int
	uncontended time.Duration
	slices      int
	contended   time.Duration
	contenders  []int
	holds       []time.Duration
	churn       int
	sizes       []int
	renewTTL    time.Duration
	periods     int
	out         string
	mdName      string
	pngName     string
	note        string
	strict      bool
}

var (
	allGroups    = []string{"redis", "redlock", "etcd", "zk", "postgres", "consul", "memory"}
	allScenarios = []string{"uncontended", "contended", "renewal", "idempotency"}
)

// parseSettings reads the flags. -quick changes the defaults of the flags
// that size the run, and only of those not given explicitly.
func parseSettings(args []string, stderr io.Writer) (settings, error) {
	var s settings
	fs := flag.NewFlagSet("bench-peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&s.quick, "quick", false, "smoke run of about two minutes: one repetition, short windows, few contenders and locks")
	groups := fs.String("pairs", strings.Join(allGroups, ","), "groups of pairs to measure: "+strings.Join(allGroups, ","))
	scenarios := fs.String("scenarios", strings.Join(allScenarios, ","), "scenarios to run: "+strings.Join(allScenarios, ","))
	fs.IntVar(&s.reps, "reps", 3, "repetitions of every measurement; the report shows medians")
	fs.DurationVar(&s.uncontended, "d", 1500*time.Millisecond, "window of one subject's uncontended measurement in a repetition")
	fs.IntVar(&s.slices, "slices", 6, "slices each uncontended window is cut into, run in turns with the other subjects' slices")
	fs.DurationVar(&s.contended, "cd", 2*time.Second, "window of one contended measurement")
	contenders := fs.String("contenders", "8,64", "contender counts, each its own clients, on one key")
	holds := fs.String("holds", "0,1ms", "how long a contender holds the lock, each measured (a sleep; Go's timers on Linux rarely sleep much less than 1ms)")
	fs.IntVar(&s.churn, "churn", 1_000_000, "lock cycles each PostgreSQL lock table serves before it is measured, so that it is measured in its steady state (dead tuples, vacuum), not fresh")
	sizes := fs.String("locks", "1000,10000,100000", "held-lock counts for the renewal scenario")
	fs.DurationVar(&s.renewTTL, "ttl", 3*time.Second, "lease TTL in the renewal scenario; renewals come every TTL/3")
	fs.IntVar(&s.periods, "periods", 2, "renewal periods counted in the renewal scenario")
	fs.StringVar(&s.out, "out", ".", "directory to write the report and the chart to")
	fs.StringVar(&s.mdName, "md", "BENCHMARKS.md", "file name of the report in -out")
	fs.StringVar(&s.pngName, "png", "bench-peers.png", "file name of the chart in -out")
	fs.StringVar(&s.note, "note", "", "a remark for the report's machine section (a shared machine, say)")
	fs.BoolVar(&s.strict, "strict", os.Getenv("WARDEN_REQUIRE_SERVERS") == "1", "fail when a group's servers do not answer, instead of leaving it out")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if s.quick {
		quick := map[string]func(){
			"reps":       func() { s.reps = 1 },
			"d":          func() { s.uncontended = 150 * time.Millisecond },
			"slices":     func() { s.slices = 2 },
			"cd":         func() { s.contended = 300 * time.Millisecond },
			"contenders": func() { *contenders = "2,8" },
			"locks":      func() { *sizes = "50,200" },
			"ttl":        func() { s.renewTTL = 2 * time.Second }, // etcd's shortest lease
			"periods":    func() { s.periods = 1 },
			"churn":      func() { s.churn = 2000 },
		}
		for name, apply := range quick {
			if !set[name] {
				apply()
			}
		}
	}
	var err error
	if s.groups, err = pick(*groups, allGroups, "-pairs"); err != nil {
		return s, err
	}
	if s.scenarios, err = pick(*scenarios, allScenarios, "-scenarios"); err != nil {
		return s, err
	}
	if s.contenders, err = positiveInts(*contenders, "-contenders"); err != nil {
		return s, err
	}
	if s.sizes, err = positiveInts(*sizes, "-locks"); err != nil {
		return s, err
	}
	if s.holds, err = durations(*holds, "-holds"); err != nil {
		return s, err
	}
	switch {
	case s.reps < 1:
		return s, fmt.Errorf("-reps %d: want at least 1", s.reps)
	case s.uncontended <= 0 || s.contended <= 0:
		return s, errors.New("-d and -cd must be positive")
	case s.slices < 1 || s.uncontended/time.Duration(s.slices) < time.Millisecond:
		return s, fmt.Errorf("-slices %d: want at least 1, and slices of -d %v of 1ms or more", s.slices, s.uncontended)
	case s.churn < 0:
		return s, errors.New("-churn must not be negative")
	case s.renewTTL < 300*time.Millisecond:
		return s, fmt.Errorf("-ttl %v: want at least 300ms", s.renewTTL)
	case s.periods < 1:
		return s, fmt.Errorf("-periods %d: want at least 1", s.periods)
	}
	return s, nil
}

// pick parses a comma-separated subset of known, keeping known's order.
func pick(list string, known []string, flagName string) ([]string, error) {
	want := map[string]bool{}
	for _, w := range strings.Split(list, ",") {
		w = strings.TrimSpace(w)
		if w == "" {
			continue
		}
		if !slices.Contains(known, w) {
			return nil, fmt.Errorf("%s: unknown %q, want some of %s", flagName, w, strings.Join(known, ","))
		}
		want[w] = true
	}
	var out []string
	for _, k := range known {
		if want[k] {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: nothing selected", flagName)
	}
	return out, nil
}

func positiveInts(list, flagName string) ([]int, error) {
	return parseList(list, flagName, "a positive integer", func(f string) (int, bool) {
		n, err := strconv.Atoi(f)
		return n, err == nil && n >= 1
	})
}

// durations parses a comma-separated list of durations, "0" included.
func durations(list, flagName string) ([]time.Duration, error) {
	return parseList(list, flagName, "a duration of 0 or more", func(f string) (time.Duration, bool) {
		d, err := time.ParseDuration(f)
		return d, err == nil && d >= 0
	})
}

// parseList parses a comma-separated list, each item once; what names what
// an item must be, for the error.
func parseList[T comparable](list, flagName, what string, parse func(string) (T, bool)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, ok := parse(f)
		if !ok {
			return nil, fmt.Errorf("%s: %q is not %s", flagName, f, what)
		}
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: empty", flagName)
	}
	return out, nil
}

// run is the whole program, callable from the test: the parent, or with
// childFlag first, a group's process.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	if group, path, rest, ok := childArgs(args); ok {
		return runChild(ctx, group, path, rest, stdout)
	}
	s, err := parseSettings(args, os.Stderr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.out, 0o755); err != nil {
		return err
	}
	b, err := newBench(s, stdout)
	if err != nil {
		return err
	}
	if err := b.measureGroups(ctx, args); err != nil {
		return err
	}
	return b.writeOutputs()
}

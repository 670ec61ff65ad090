//go:build clusters

package clusters

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var results struct {
	mu   sync.Mutex
	rows []verdict
}

func record(v verdict) {
	results.mu.Lock()
	defer results.mu.Unlock()
	results.rows = append(results.rows, v)
}

// TestMain prints the summary table of every scenario that ran, after all
// of them, so that it appears once at the end of the output.
func TestMain(m *testing.M) {
	code := m.Run()
	results.mu.Lock()
	rows := results.rows
	results.mu.Unlock()
	if len(rows) > 0 {
		// Printed, which go test shows with -v or on failure, and kept
		// beside the clusters' state, since a passing package's output is
		// otherwise dropped.
		report := table(rows)
		fmt.Print(report)
		file := filepath.Join(setting("WARDEN_CLUSTERS_DIR"), "last-report.txt")
		if err := os.WriteFile(file, []byte(report), 0o644); err == nil {
			fmt.Printf("\n(also in %s)\n", file)
		}
	}
	os.Exit(code)
}

func table(rows []verdict) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-30s %7s %9s %8s %9s %9s %8s %14s %12s  %s\n", "scenario", "cycles", "accepted", "refused",
		"overlaps", "out-of-", "double", "longest", "free while", "verdict")
	fmt.Fprintf(&b, "%-30s %7s %9s %8s %9s %9s %8s %14s %12s\n", "", "", "", "", "accepted", "order", "grants", "unavailable", "waiting")
	for _, v := range rows {
		verdict := "ok"
		if len(v.failures) > 0 {
			verdict = fmt.Sprintf("FAILED (%d)", len(v.failures))
		}
		free := v.freeWaiting.Round(time.Millisecond).String()
		if !v.judgeFree {
			free = "(" + free + ")"
		}
		fmt.Fprintf(&b, "%-30s %7d %9d %8d %9d %9d %8d %14v %12s  %s\n", v.scenario, v.cycles, v.accepted, v.refused,
			v.overlaps, v.outOfOrder, v.doubleGrants, v.longest.Round(time.Millisecond), free, verdict)
	}
	fmt.Fprintf(&b, "\nfree while waiting: the longest time a waiting worker saw its key free once the cluster served again (bound %v; in parentheses where not judged)\n", freeBound)
	b.WriteString("\nper fault: longest time without a grant / bound (max(ttl, time until the cluster served again) + 1s;\n" +
		"on Consul the time until the cluster served again + 1s); longest free while waiting\n")
	for _, v := range rows {
		for _, e := range v.events {
			mark := ""
			if e.unavailable > e.bound || (v.judgeFree && e.freeWaiting > freeBound) {
				mark = "  EXCEEDED"
			}
			fmt.Fprintf(&b, "  %-30s %-50s %8v / %v; %v%s\n", v.scenario, e.name,
				e.unavailable.Round(time.Millisecond), e.bound.Round(time.Millisecond), e.freeWaiting.Round(time.Millisecond), mark)
		}
	}
	b.WriteString("\nnotes\n")
	for _, v := range rows {
		for _, n := range v.notes {
			fmt.Fprintf(&b, "  %-30s %s\n", v.scenario, n)
		}
		for _, f := range v.failures {
			fmt.Fprintf(&b, "  %-30s FAILED: %s\n", v.scenario, f)
		}
	}
	return b.String()
}

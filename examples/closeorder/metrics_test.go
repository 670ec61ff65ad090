package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMetricsAndDashboard: /metrics on a running service holds warden's
// lock, idempotency and scheduler metrics, durations in seconds, and every
// metric the shipped Grafana dashboard queries.
func TestMetricsAndDashboard(t *testing.T) {
	bin := buildService(t)
	r := startReplica(t, bin, "metrics", "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"), "-lock", "memory",
		"-schedule", "@every 1s")
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.url+"/orders", strings.NewReader(`{"amount_cents": 100}`))
	req.Header.Set("X-User-ID", "user-1")
	req.Header.Set("Idempotency-Key", "metrics-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var runs []JobRun
	waitUntil(t, "a scheduler run", 30*time.Second, func() bool {
		return getJSON(t, "http://"+r.admin+"/jobs/runs", &runs) == nil && len(runs) > 0
	})
	var page string
	// The scheduler releases its lock only after LockAtLeastFor, so the
	// run's count can show before the lock's hold duration does.
	waitUntil(t, "the run's metrics", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + r.admin + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		page = string(b)
		return strings.Contains(page, "warden_scheduler_runs_total") && strings.Contains(page, "warden_lock_hold_duration_seconds_count")
	})
	has := func(name string) bool {
		return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `[{ ]`).MatchString(page)
	}
	for _, name := range []string{"warden_lock_acquire_duration_seconds_bucket", "warden_lock_hold_duration_seconds_count",
		"warden_lock_held", "warden_lock_waiters", "warden_idempotency_requests_total", "warden_idempotency_store_duration_seconds_bucket", "warden_scheduler_runs_total", "warden_scheduler_lag_seconds_bucket"} {
		if !has(name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}

	raw, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	names := regexp.MustCompile(`warden_[a-z_]+`)
	grouping := regexp.MustCompile(`by \(([^)]*)\)`)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, g := range grouping.FindAllStringSubmatch(tg.Expr, -1) {
				for _, label := range strings.Split(g[1], ",") {
					if label = strings.TrimSpace(label); label != "le" && label != "instance" && !strings.Contains(page, label+`="`) {
						t.Errorf("panel %q groups by %s, a label no metric has", p.Title, label)
					}
				}
			}
			for _, name := range names.FindAllString(grouping.ReplaceAllString(tg.Expr, ""), -1) {
				if !has(name) {
					t.Errorf("panel %q queries %s, which /metrics does not have", p.Title, name)
				}
			}
		}
	}
}

package debugpage_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/debugpage"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

var update = flag.Bool("update", false, "rewrite testdata/debugpage.png from the Chromium run")

// fixture is a process with two held locks, one of them waited for, a
// scheduler job that ran, and an idempotency record.
type fixture struct {
	g    *guard.Guard
	held []*guard.Lock
	srv  *httptest.Server
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	mem := memory.New()
	g, err := guard.New(mem, guard.WithOwner("orders-7f9c/4242"), guard.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{g: g}
	for _, k := range []string{"orders/close", "reports/daily"} {
		l, err := g.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		f.held = append(f.held, l)
	}
	other, err := guard.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	go other.Lock(wctx, "orders/close")
	deadline := time.Now().Add(10 * time.Second)
	for mem.Waiters("warden:orders/close") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}

	store := idempotency.NewMemoryStore()
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "user-1", Key: "pay-42", Fingerprint: "sha256:ab12",
		Owner: "api-2:secretsecretsecret", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	s, err := scheduler.New(g, scheduler.WithInstance("orders-7f9c"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Add("@every 200ms", "close-unpaid", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	s.Start()
	// The scheduler records a run after the job returns, so wait for the
	// record itself, not for a signal from inside the job.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if e := s.Entries(); len(e) == 1 && e[0].Last != nil && e[0].Last.Outcome == scheduler.Ran {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job never ran")
		}
	}
	page, err := debugpage.New(g, debugpage.WithScheduler(s), debugpage.WithStore(store))
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(page)
	t.Cleanup(func() {
		f.srv.Close()
		cancel()
		s.Stop(context.Background())
		for _, l := range f.held {
			l.Unlock(context.Background())
		}
	})
	return f
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestJSON(t *testing.T) {
	f := newFixture(t)
	code, body := get(t, f.srv.URL+"?format=json&scope=user-1&key=pay-42")
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var v debugpage.View
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("%v in %s", err, body)
	}
	// The job's own lock may be among them, held for its LockAtLeastFor.
	held := map[string]debugpage.Held{}
	for _, h := range v.Held {
		held[h.Key] = h
	}
	oc, rd := held["orders/close"], held["reports/daily"]
	if v.Owner != "orders-7f9c/4242" || oc.Token != f.held[0].Token() || rd.Token != f.held[1].Token() {
		t.Fatalf("view %+v, want the two held locks of orders-7f9c/4242", v)
	}
	if oc.Waiters != 1 || rd.Waiters != 0 || len(v.Contended) != 1 || v.Contended[0] != "orders/close" {
		t.Fatalf("waiters %d and %d, contended %q; want orders/close waited for by one", oc.Waiters, rd.Waiters, v.Contended)
	}
	if len(v.Jobs) != 1 || v.Jobs[0].Last == nil || v.Jobs[0].Last.Outcome != scheduler.Ran || v.Jobs[0].Next.IsZero() {
		t.Fatalf("jobs %+v, want close-unpaid with a run and a next slot", v.Jobs)
	}
	if l := v.Lookup; l == nil || !l.Found || l.State != "in_progress" || l.Instance != "api-2" {
		t.Fatalf("lookup %+v, want the in-progress record by api-2", v.Lookup)
	}
	if strings.Contains(body, "secretsecret") {
		t.Fatal("the page shows an owner token, which would let a reader complete or abandon the claim")
	}
}

func TestHTMLAndErrors(t *testing.T) {
	f := newFixture(t)
	code, body := get(t, f.srv.URL+"?scope=user-1&key=nothing-here")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	for _, want := range []string{"orders/close", strconv.FormatUint(f.held[0].Token(), 10), "close-unpaid", "No live record under this key."} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	resp, err := http.Post(f.srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d, want 405", resp.StatusCode)
	}
	if _, err := debugpage.New(nil); err == nil {
		t.Fatal("New(nil) accepted")
	}
	if _, err := debugpage.New(f.g, debugpage.WithInspectTimeout(0)); err == nil {
		t.Fatal("a zero inspect timeout accepted")
	}
}

// TestInChromium renders the page in headless Chromium at a phone's size:
// the DOM it builds holds the held locks and the job, and the screenshot is
// a real image (kept in testdata with -update, for the README).
func TestInChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		drivertest.Unreachable(t, "chromium", "$PATH", err)
		return
	}
	f := newFixture(t)
	url := f.srv.URL + "?scope=user-1&key=pay-42"
	chrome := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--headless", "--no-sandbox", "--disable-gpu",
			"--disable-dev-shm-usage", "--no-first-run", "--user-data-dir=" + t.TempDir(), "--window-size=412,915"}, args...)...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v", args, err)
		}
		return string(out)
	}
	dom := chrome("--dump-dom", url)
	for _, want := range []string{`id="held"`, "orders/close", "reports/daily", strconv.FormatUint(f.held[1].Token(), 10),
		`id="contended"`, `id="jobs"`, "close-unpaid", `id="lookup"`, "in_progress"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	shot := filepath.Join(t.TempDir(), "page.png")
	chrome("--screenshot="+shot, "--hide-scrollbars", url)
	raw, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 300 || b.Dy() < 300 {
		t.Fatalf("screenshot of %v", b)
	}
	if *update {
		if err := os.WriteFile(filepath.Join("testdata", "debugpage.png"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A failed run's error reaches the JSON as its text, under the run, and the
// held locks' fields are named as the rest of the JSON is: a Go error value
// marshalled to {}, and a HeldLock's fields kept their Go names.
func TestJSONOfAFailedRun(t *testing.T) {
	g, err := guard.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	l, err := g.Lock(context.Background(), "held")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	s, err := scheduler.New(g)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Add("@every 200ms", "fails", func(context.Context) error { return errors.New("disk full") }); err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Stop(context.Background())
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if e := s.Entries(); len(e) == 1 && e[0].Last != nil && e[0].Last.Outcome == scheduler.Failed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job never failed")
		}
	}
	page, err := debugpage.New(g, debugpage.WithScheduler(s))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(page)
	defer srv.Close()
	code, body := get(t, srv.URL+"?format=json")
	var v struct {
		Held []map[string]any `json:"held"`
		Jobs []struct {
			Last map[string]any `json:"last"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil {
		t.Fatalf("status %d, %v: %s", code, err, body)
	}
	if len(v.Jobs) != 1 || v.Jobs[0].Last["error"] != "disk full" || v.Jobs[0].Last["outcome"] != string(scheduler.Failed) {
		t.Errorf("jobs in %s, want the failed run with its error as text", body)
	}
	// The job's own lock may be among them, held for its LockAtLeastFor.
	if !slices.ContainsFunc(v.Held, func(h map[string]any) bool { return h["key"] == "held" && h["token"] != nil }) {
		t.Errorf("held in %s, want the lock under key and token", body)
	}
}

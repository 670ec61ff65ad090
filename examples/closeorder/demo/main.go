// Command demo runs three closeorder replicas against one backend, puts them
// under a retrying client load, and checks what the cluster did: the close
// job never ran on two replicas at once, every unpaid order was closed once,
// and retried requests were answered from the idempotency store.
//
//	make demo
//	go run ./examples/closeorder/demo -duration 30s
//	LOCK=redis://127.0.0.1:6379 go run ./examples/closeorder/demo
//
// Environment: LOCK, DB and IDEMPOTENCY pass -lock, -db and -idempotency to
// the replicas (default: one SQLite file in a temporary directory);
// DURATION sets the load time; KEEP=1 keeps the temporary directory (logs
// and database).
package main

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warden-go/warden/backends/backendurl"
)

const (
	replicaCount = 3
	schedule     = "@every 1s"
	unpaidAfter  = 3 * time.Second
	workDelay    = 20 * time.Millisecond
	ttl          = 2 * time.Second
	// runsLimit is the most GET /jobs/runs hands out in one page.
	runsLimit = 10000
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx)
	stop()
	os.Exit(code)
}

type options struct {
	duration    time.Duration
	users       int
	retryRatio  float64
	payRatio    float64
	db          string
	lock        string
	idempotency string
	keep        bool
}

func parseOptions() (*options, error) {
	o := &options{}
	dur := 20 * time.Second
	if v := os.Getenv("DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("DURATION=%q: %v", v, err)
		}
		dur = d
	}
	flag.DurationVar(&o.duration, "duration", dur, "how long the load runs (env DURATION)")
	flag.IntVar(&o.users, "users", 6, "concurrent simulated users")
	flag.Float64Var(&o.retryRatio, "retry", 0.3, "fraction of order requests sent again with the same key")
	flag.Float64Var(&o.payRatio, "pay", 0.5, "fraction of orders paid")
	flag.StringVar(&o.db, "db", os.Getenv("DB"), "replicas' -db (env DB; default a SQLite file in the temporary directory)")
	flag.StringVar(&o.lock, "lock", os.Getenv("LOCK"), "replicas' -lock (env LOCK; default: same as -db)")
	flag.StringVar(&o.idempotency, "idempotency", os.Getenv("IDEMPOTENCY"), "replicas' -idempotency (env IDEMPOTENCY)")
	flag.Parse()
	o.keep = os.Getenv("KEEP") == "1"
	switch {
	case flag.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", flag.Arg(0))
	case o.duration <= 0 || o.duration > time.Hour:
		return nil, fmt.Errorf("-duration %v: want (0, 1h]", o.duration)
	case o.users < 1 || o.users > 100:
		return nil, fmt.Errorf("-users %d: want 1 to 100", o.users)
	case o.retryRatio < 0 || o.retryRatio > 1 || o.payRatio < 0 || o.payRatio > 1:
		return nil, errors.New("-retry and -pay are fractions in [0, 1]")
	}
	return o, nil
}

func run(ctx context.Context) int {
	o, err := parseOptions()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 2
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "closeorder-demo-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 1
	}
	defer func() {
		if o.keep {
			fmt.Printf("kept %s (KEEP=1)\n", tmp)
			return
		}
		os.RemoveAll(tmp)
	}()
	if o.db == "" {
		o.db = "sqlite://" + filepath.Join(tmp, "demo.db")
	}

	fmt.Printf("building ./examples/closeorder into %s\n", tmp)
	bin := filepath.Join(tmp, "closeorder")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/closeorder")
	build.Dir, build.Stdout, build.Stderr = root, os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: go build: %v\n", err)
		return 1
	}

	// A shared database may hold earlier demos' rows: only this run's count.
	since := time.Now().UTC()
	cluster := &cluster{}
	defer cluster.stop()
	if err := cluster.start(ctx, bin, tmp, o); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 1
	}

	c := newClient(cluster.urls(), o.users)
	fmt.Printf("load: %d users for %v, %.0f%% of order requests retried with the same key, %.0f%% of orders paid\n",
		o.users, o.duration, o.retryRatio*100, o.payRatio*100)
	c.load(ctx, o)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "demo: interrupted")
		return 1
	}
	fmt.Printf("load done: %d orders created; waiting for the close job to close the unpaid ones\n", c.stats.created.Load())

	base := cluster.urls()[0]
	if err := waitClosed(ctx, c, base, since, 15*time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		// The summary still says what did and did not happen.
	}
	s, err := summarize(ctx, c, base, cluster.replicas[0].admin, since)
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 1
	}
	s.print(os.Stdout, cluster, c)
	if !s.ok() {
		return 1
	}
	return 0
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the warden module: run from the repository")
	}
	return filepath.Dir(gomod), nil
}

// ---- replicas ----

type replica struct {
	name    string
	url     string // the API
	admin   string // the operator endpoints (job runs, debug page, metrics)
	cmd     *exec.Cmd
	stdout  string // log file paths
	stderr  string
	exited  chan struct{}
	waitErr error
}

type cluster struct {
	replicas []*replica
}

func (c *cluster) urls() []string {
	var out []string
	for _, r := range c.replicas {
		out = append(out, r.url)
	}
	return out
}

var listening = regexp.MustCompile(`listening on (http://\S+) .*admin on (http://\S+)`)

// start launches the replicas on ports the kernel picks (-addr and
// -admin-addr :0), learns their addresses from each replica's first line,
// and waits for /healthz.
func (c *cluster) start(ctx context.Context, bin, dir string, o *options) error {
	for i := 1; i <= replicaCount; i++ {
		r := &replica{
			name:   fmt.Sprintf("replica-%d", i),
			stdout: filepath.Join(dir, fmt.Sprintf("replica-%d.out.log", i)),
			stderr: filepath.Join(dir, fmt.Sprintf("replica-%d.err.log", i)),
			exited: make(chan struct{}),
		}
		args := []string{
			"-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-db", o.db,
			"-schedule", schedule, "-unpaid-after", unpaidAfter.String(),
			"-work-delay", workDelay.String(), "-ttl", ttl.String(), "-instance", r.name,
		}
		if o.lock != "" {
			args = append(args, "-lock", o.lock)
		}
		if o.idempotency != "" {
			args = append(args, "-idempotency", o.idempotency)
		}
		addr, err := r.launch(bin, args)
		if err != nil {
			return err
		}
		c.replicas = append(c.replicas, r)
		select {
		case a := <-addr:
			r.url, r.admin = a[0], a[1]
		case <-r.exited:
			return r.failed("exited before listening")
		case <-time.After(20 * time.Second):
			return r.failed("did not report its address within 20s")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fmt.Printf("replicas (logs in %s):\n", dir)
	for _, r := range c.replicas {
		if err := waitHealthy(ctx, r, 20*time.Second); err != nil {
			return err
		}
		fmt.Printf("  %s  %s  admin %s  stdout %s  stderr %s\n", r.name, r.url, r.admin, filepath.Base(r.stdout), filepath.Base(r.stderr))
	}
	fmt.Printf("  db %s, lock %s, idempotency %s\n", backendurl.Redact(o.db), redacted(o.lock, "same as -db"), redacted(o.idempotency, "the service's default"))
	return nil
}

// redacted is the URL s as it may be printed, or d when s is empty.
func redacted(s, d string) string {
	if s == "" {
		return d
	}
	return backendurl.Redact(s)
}

// launch starts the replica and returns where its address will arrive.
func (r *replica) launch(bin string, args []string) (<-chan [2]string, error) {
	outF, err := os.Create(r.stdout)
	if err != nil {
		return nil, err
	}
	errF, err := os.Create(r.stderr)
	if err != nil {
		outF.Close()
		return nil, err
	}
	// Not CommandContext: on Ctrl-C the replicas get SIGTERM from stop, so
	// they shut down the way a deployment would stop them.
	r.cmd = exec.Command(bin, args...)
	r.cmd.Stderr = errF
	pipe, err := r.cmd.StdoutPipe()
	if err != nil {
		outF.Close()
		errF.Close()
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		outF.Close()
		errF.Close()
		return nil, fmt.Errorf("%s: %v", r.name, err)
	}
	addr := make(chan [2]string, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pipe)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(outF, line)
			if m := listening.FindStringSubmatch(line); m != nil && !sent {
				addr <- [2]string{m[1], m[2]}
				sent = true
			}
		}
		io.Copy(outF, pipe)
	}()
	go func() {
		<-copied // Wait closes the pipe: read it to the end first
		r.waitErr = r.cmd.Wait()
		outF.Close()
		errF.Close()
		close(r.exited)
	}()
	return addr, nil
}

// failed prints the replica's stderr, which says why it did not come up.
func (r *replica) failed(why string) error {
	b, _ := os.ReadFile(r.stderr)
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	fmt.Fprintf(os.Stderr, "--- %s stderr (%s) ---\n%s--- end ---\n", r.name, r.stderr, b)
	select {
	case <-r.exited:
		return fmt.Errorf("%s %s (%v)", r.name, why, r.waitErr)
	default:
		return fmt.Errorf("%s %s", r.name, why)
	}
}

func waitHealthy(ctx context.Context, r *replica, within time.Duration) error {
	deadline := time.Now().Add(within)
	hc := &http.Client{Timeout: 3 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/healthz", nil)
		resp, err := hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-r.exited:
			return r.failed("exited while waiting for /healthz")
		default:
		}
		if time.Now().After(deadline) {
			return r.failed(fmt.Sprintf("/healthz not OK within %v: %v", within, err))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM to every replica at once, then SIGKILL to those still
// running after the service's own shutdown bound (10s) and a margin.
func (c *cluster) stop() {
	if len(c.replicas) == 0 {
		return
	}
	for _, r := range c.replicas {
		r.cmd.Process.Signal(syscall.SIGTERM)
	}
	timeout := time.After(15 * time.Second)
	for _, r := range c.replicas {
		select {
		case <-r.exited:
		case <-timeout:
			fmt.Fprintf(os.Stderr, "demo: %s did not stop within 15s of SIGTERM: killing it\n", r.name)
			r.cmd.Process.Kill()
			<-r.exited
		}
	}
	for _, r := range c.replicas {
		if r.waitErr != nil {
			fmt.Fprintf(os.Stderr, "demo: %s exited: %v (see %s)\n", r.name, r.waitErr, r.stderr)
		}
	}
	fmt.Println("replicas stopped")
}

// ---- load ----

type client struct {
	hc    *http.Client
	urls  []string
	users int // user-1 ... user-N, who see only their own orders
	stats struct {
		created, replayed, conflicts, retries, paid, payClosed atomic.Int64
		replayMismatch, duplicateCreates, unexpected           atomic.Int64
		unknownKeys                                            atomic.Int64
	}
	mu       sync.Mutex
	ids      map[int64]bool
	lastErrs []string
}

func newClient(urls []string, users int) *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 32
	return &client{hc: &http.Client{Timeout: 10 * time.Second, Transport: tr}, urls: urls, users: users, ids: map[int64]bool{}}
}

type response struct {
	status   int
	replayed bool
	body     []byte
	err      error
}

func (c *client) post(ctx context.Context, base, path, user, key string, body []byte) response {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		return response{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.hc.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return response{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: b, err: err}
}

func (c *client) unexpected(what string, r response) {
	c.stats.unexpected.Add(1)
	msg := fmt.Sprintf("%s: status %d %v %s", what, r.status, r.err, bytes.TrimSpace(r.body))
	c.mu.Lock()
	if len(c.lastErrs) < 5 {
		c.lastErrs = append(c.lastErrs, msg)
	}
	c.mu.Unlock()
}

// send posts until the answer is final: a 409 means the same key is still in
// flight elsewhere, which a client retries after a pause (bounded).
func (c *client) send(ctx context.Context, base, path, user, key string, body []byte) response {
	var r response
	for attempt := 0; attempt < 20 && ctx.Err() == nil; attempt++ {
		r = c.post(ctx, base, path, user, key, body)
		if r.replayed {
			c.stats.replayed.Add(1)
		}
		if r.err != nil || r.status != http.StatusConflict || !isInProgress(r.body) {
			return r
		}
		c.stats.conflicts.Add(1)
		time.Sleep(time.Duration(20+rand.IntN(40)) * time.Millisecond)
	}
	return r
}

// isInProgress tells the idempotency 409 from the 409 of paying a closed
// order.
func isInProgress(body []byte) bool {
	var p struct{ Title string }
	json.Unmarshal(body, &p)
	return p.Title != "order closed"
}

func (c *client) load(ctx context.Context, o *options) {
	// The deadline stops new orders only: a request cut off mid-flight
	// would leave an order no client was told of.
	deadline := time.Now().Add(o.duration)
	var wg sync.WaitGroup
	for u := 1; u <= o.users; u++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.user(ctx, fmt.Sprintf("user-%d", u), o, deadline)
		}()
	}
	wg.Wait()
}

const maxOrdersPerUser = 5000

func (c *client) user(ctx context.Context, user string, o *options, deadline time.Time) {
	for i := 0; i < maxOrdersPerUser && ctx.Err() == nil && time.Now().Before(deadline); i++ {
		c.order(ctx, user, o)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(50+rand.IntN(100)) * time.Millisecond):
		}
	}
}

type orderBody struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
}

func (c *client) order(ctx context.Context, user string, o *options) {
	body := fmt.Appendf(nil, `{"amount_cents": %d}`, 100+rand.IntN(9900))
	key := newKey()
	first := rand.IntN(len(c.urls))
	// The retry goes to another replica, as behind a load balancer.
	second := (first + 1 + rand.IntN(len(c.urls)-1)) % len(c.urls)
	var rs []response
	switch retry := rand.Float64() < o.retryRatio; {
	case !retry:
		rs = append(rs, c.send(ctx, c.urls[first], "/orders", user, key, body))
	case rand.IntN(2) == 0:
		// The client timed out and retried while the first was in flight.
		c.stats.retries.Add(1)
		rs = make([]response, 2)
		var wg sync.WaitGroup
		for n, i := range []int{first, second} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rs[n] = c.send(ctx, c.urls[i], "/orders", user, key, body)
			}()
		}
		wg.Wait()
	default:
		// The answer was lost on the way back: the client sends it again.
		c.stats.retries.Add(1)
		rs = append(rs, c.send(ctx, c.urls[first], "/orders", user, key, body))
		rs = append(rs, c.send(ctx, c.urls[second], "/orders", user, key, body))
	}

	var id int64
	fresh := 0
	for _, r := range rs {
		if r.err != nil || r.status != http.StatusCreated {
			if ctx.Err() == nil {
				c.unexpected("POST /orders", r)
			}
			continue
		}
		var ord orderBody
		if err := json.Unmarshal(r.body, &ord); err != nil || ord.ID == 0 {
			c.unexpected("POST /orders body", r)
			continue
		}
		if !r.replayed {
			fresh++
		}
		if id != 0 && ord.ID != id {
			c.stats.replayMismatch.Add(1)
		}
		id = ord.ID
	}
	if fresh > 1 {
		c.stats.duplicateCreates.Add(1)
	}
	if id == 0 {
		// The order may or may not exist: the summary allows for it.
		c.stats.unknownKeys.Add(1)
		return
	}
	c.mu.Lock()
	c.ids[id] = true
	c.mu.Unlock()
	c.stats.created.Add(1)

	if rand.Float64() >= o.payRatio || ctx.Err() != nil {
		return
	}
	r := c.send(ctx, c.urls[rand.IntN(len(c.urls))], "/orders/"+strconv.FormatInt(id, 10)+"/pay", user, newKey(), nil)
	switch {
	case r.err == nil && r.status == http.StatusOK:
		c.stats.paid.Add(1)
	case r.err == nil && r.status == http.StatusConflict:
		c.stats.payClosed.Add(1)
	case ctx.Err() == nil:
		c.unexpected("POST /orders/{id}/pay", r)
	}
}

func newKey() string {
	b := make([]byte, 16)
	crand.Read(b)
	return hex.EncodeToString(b)
}

// ---- results ----

type order struct {
	ID          int64      `json:"id"`
	UserID      string     `json:"user_id"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"created_at"`
	ClosedBy    *string    `json:"closed_by"`
	ClosedToken *uint64    `json:"closed_token"`
	ClosedAt    *time.Time `json:"closed_at"`
}

type jobRun struct {
	Job           string     `json:"job"`
	Slot          time.Time  `json:"slot"`
	Instance      string     `json:"instance"`
	Token         uint64     `json:"token"`
	StartedAt     time.Time  `json:"started_at"`
	FinishedAt    *time.Time `json:"finished_at"`
	Outcome       string     `json:"outcome"`
	Closed        int        `json:"closed"`
	StaleRejected bool       `json:"stale_rejected"`
}

func (c *client) getJSON(ctx context.Context, url, user string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, bytes.TrimSpace(b))
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// orders lists every simulated user's orders: each user sees only their
// own.
func (c *client) orders(ctx context.Context, base, status string, since time.Time) ([]order, error) {
	var all []order
	url := base + "/orders"
	if status != "" {
		url += "?status=" + status
	}
	for u := 1; u <= c.users; u++ {
		var mine []order
		if err := c.getJSON(ctx, url, fmt.Sprintf("user-%d", u), &mine); err != nil {
			return nil, err
		}
		all = append(all, mine...)
	}
	out := all[:0]
	for _, o := range all {
		if !o.CreatedAt.Before(since) {
			out = append(out, o)
		}
	}
	return out, nil
}

// waitClosed waits until no order of this run is left unpaid: with the load
// over, every unpaid order ages past -unpaid-after and the job must close it.
func waitClosed(ctx context.Context, c *client, base string, since time.Time, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		unpaid, err := c.orders(ctx, base, "unpaid", since)
		if err == nil && len(unpaid) == 0 {
			// Let the run that closed the last ones record its finish.
			time.Sleep(settle)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("waiting for the close job: %v", err)
			}
			old := 0
			for _, o := range unpaid {
				if time.Since(o.CreatedAt) > unpaidAfter {
					old++
				}
			}
			return fmt.Errorf("after %v, %d orders unpaid for longer than %v are still not closed", within, old, unpaidAfter)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// settle is one schedule period and a margin.
const settle = 1500 * time.Millisecond

type summary struct {
	orders, runs       int
	paid               int
	closed, unpaidLeft int
	perReplica         map[string]int
	outcomes           map[string]int
	overlaps           int
	staleRejected      int
	slotsRunTwice      int
	closedOnce         int
	closedBad          []string
	countMismatch      []string
	extraOrders        int
	runsTruncated      bool
	checksCache        []check
}

func summarize(ctx context.Context, c *client, base, admin string, since time.Time) (*summary, error) {
	ords, err := c.orders(ctx, base, "", since)
	if err != nil {
		return nil, err
	}
	var all []jobRun
	if err := c.getJSON(ctx, fmt.Sprintf("%s/jobs/runs?limit=%d", admin, runsLimit), "", &all); err != nil {
		return nil, err
	}
	s := &summary{perReplica: map[string]int{}, outcomes: map[string]int{}, runsTruncated: len(all) == runsLimit}
	var runs []jobRun
	for _, r := range all {
		if r.Job == "close-unpaid-orders" && !r.StartedAt.Before(since) {
			runs = append(runs, r)
		}
	}
	s.orders, s.runs = len(ords), len(runs)

	c.mu.Lock()
	for _, o := range ords {
		if !c.ids[o.ID] {
			s.extraOrders++
		}
	}
	c.mu.Unlock()

	// A run held the lock when it ran, failed or lost it; "running" is a
	// run whose finish is not recorded yet, open-ended.
	type span struct {
		r          jobRun
		start, end time.Time
	}
	var held []span
	byToken := map[uint64][]jobRun{}
	slots := map[time.Time]int{}
	far := time.Now().Add(time.Hour)
	for _, r := range runs {
		s.outcomes[r.Outcome]++
		if r.StaleRejected {
			s.staleRejected++
		}
		switch r.Outcome {
		case "ran", "failed", "lost", "running":
		default:
			continue
		}
		if r.Outcome == "ran" {
			s.perReplica[r.Instance]++
			slots[r.Slot.UTC()]++
		}
		end := far
		if r.FinishedAt != nil {
			end = *r.FinishedAt
		}
		held = append(held, span{r, r.StartedAt, end})
		byToken[r.Token] = append(byToken[r.Token], r)
	}
	sort.Slice(held, func(i, j int) bool { return held[i].start.Before(held[j].start) })
	for i := range held {
		for j := i + 1; j < len(held) && held[j].start.Before(held[i].end); j++ {
			s.overlaps++
		}
	}
	for _, n := range slots {
		if n > 1 {
			s.slotsRunTwice++
		}
	}

	closedByToken := map[uint64]int{}
	for _, o := range ords {
		switch o.Status {
		case "paid":
			s.paid++
		case "unpaid":
			s.unpaidLeft++
		case "closed":
			s.closed++
			bad := func(why string) {
				if len(s.closedBad) < 5 {
					s.closedBad = append(s.closedBad, fmt.Sprintf("order %d: %s", o.ID, why))
				}
			}
			if o.ClosedToken == nil || o.ClosedBy == nil {
				bad("closed without closed_by and closed_token")
				continue
			}
			closedByToken[*o.ClosedToken]++
			owners := byToken[*o.ClosedToken]
			switch {
			case len(owners) == 0:
				bad(fmt.Sprintf("closed_token %d belongs to no recorded run", *o.ClosedToken))
			case len(owners) > 1:
				bad(fmt.Sprintf("closed_token %d belongs to %d runs", *o.ClosedToken, len(owners)))
			case owners[0].Instance != *o.ClosedBy:
				bad(fmt.Sprintf("closed_by %s but token %d is %s's", *o.ClosedBy, *o.ClosedToken, owners[0].Instance))
			default:
				s.closedOnce++
			}
		}
	}
	// Each finished run's own count of what it closed must agree with the
	// orders carrying its token.
	for tok, rs := range byToken {
		for _, r := range rs {
			if r.FinishedAt != nil && r.Closed != closedByToken[tok] && len(s.countMismatch) < 5 {
				s.countMismatch = append(s.countMismatch, fmt.Sprintf("run %s slot %s token %d records closed=%d, orders with its token: %d",
					r.Instance, r.Slot.Format(time.TimeOnly), tok, r.Closed, closedByToken[tok]))
			}
		}
	}
	s.checksCache = s.checks(c)
	return s, nil
}

func (s *summary) checks(c *client) []check {
	return []check{
		{"overlapping runs = 0", s.overlaps == 0},
		{"no slot ran on two replicas", s.slotsRunTwice == 0},
		{"orders closed exactly once (token of a run of closed_by)", s.closedOnce == s.closed},
		{"no unpaid order left", s.unpaidLeft == 0},
		{"run records agree with the orders they closed", len(s.countMismatch) == 0},
		{"retries never created a second order", c.stats.duplicateCreates.Load() == 0 && c.stats.replayMismatch.Load() == 0},
		{"every order in the database was answered to a client", s.extraOrders <= int(c.stats.unknownKeys.Load())},
		{"paid orders = successful payments", int64(s.paid) == c.stats.paid.Load()},
	}
}

type check struct {
	name string
	ok   bool
}

func (s *summary) ok() bool {
	for _, c := range s.checksCache {
		if !c.ok {
			return false
		}
	}
	return s.overlaps == 0
}

func (s *summary) print(w io.Writer, cl *cluster, c *client) {
	var names []string
	for _, r := range cl.replicas {
		names = append(names, r.name)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "=== summary ===")
	fmt.Fprintf(w, "replicas                                     %d (%s)\n", len(names), strings.Join(names, ", "))
	fmt.Fprintf(w, "orders created                               %d (in the database: %d)\n", c.stats.created.Load(), s.orders)
	fmt.Fprintf(w, "retried order requests                       %d\n", c.stats.retries.Load())
	fmt.Fprintf(w, "duplicate requests answered from the store   %d (Idempotent-Replayed: true)\n", c.stats.replayed.Load())
	fmt.Fprintf(w, "409 while the same key was in flight         %d (retried after a pause)\n", c.stats.conflicts.Load())
	fmt.Fprintf(w, "orders paid                                  %d\n", s.paid)
	fmt.Fprintf(w, "payments refused, order closed (409)         %d\n", c.stats.payClosed.Load())
	fmt.Fprintf(w, "orders closed                                %d\n", s.closed)
	fmt.Fprintf(w, "orders left unpaid                           %d\n", s.unpaidLeft)
	fmt.Fprintf(w, "job runs recorded                            %d\n", s.runs)
	for _, n := range names {
		fmt.Fprintf(w, "  runs of %-36s %d (outcome ran)\n", n, s.perReplica[n])
	}
	fmt.Fprintf(w, "skipped runs                                 %d\n", s.outcomes["skipped"])
	for _, o := range []string{"failed", "lost", "misfired", "running"} {
		if s.outcomes[o] > 0 {
			fmt.Fprintf(w, "%-44s %d\n", o+" runs", s.outcomes[o])
		}
	}
	fmt.Fprintf(w, "overlapping runs                             %d\n", s.overlaps)
	fmt.Fprintf(w, "stale writes rejected                        %d\n", s.staleRejected)
	fmt.Fprintf(w, "orders closed exactly once                   %d of %d\n", s.closedOnce, s.closed)
	if n := c.stats.unexpected.Load(); n > 0 {
		fmt.Fprintf(w, "unexpected responses                         %d\n", n)
		for _, e := range c.lastErrs {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	if s.runsTruncated {
		fmt.Fprintf(w, "note: GET /jobs/runs returned its maximum of %d rows; older runs were not checked\n", runsLimit)
	}
	fmt.Fprintln(w, "checks:")
	for _, ch := range s.checksCache {
		mark := "ok  "
		if !ch.ok {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %s\n", mark, ch.name)
	}
	for _, d := range append(s.closedBad, s.countMismatch...) {
		fmt.Fprintf(w, "  %s\n", d)
	}
	if s.ok() {
		fmt.Fprintln(w, "PASS")
	} else {
		fmt.Fprintln(w, "FAIL")
	}
}

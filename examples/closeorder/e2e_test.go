package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	consulapi "github.com/hashicorp/consul/api"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/consullock"
	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// The end-to-end tests run the real service: three replica processes on one
// shared backend, orders created over HTTP, and the replica running the close
// job killed with SIGKILL mid-run. Every eligible order must then be closed
// exactly once, by a run whose token fits the order of the writes, and no
// two runs may have overlapped.

func TestClusterOnSQLite(t *testing.T) {
	db := "sqlite://" + filepath.Join(t.TempDir(), "e2e.db")
	runCluster(t, db, db)
}

func TestClusterOnRedis(t *testing.T) {
	addr := drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	runCluster(t, "sqlite://"+filepath.Join(t.TempDir(), "e2e.db"), "redis://"+addr)
}

// TestClusterOnZooKeeper runs the cluster on ZooKeeper alone besides the
// orders database: its locks, and its idempotency store for the scheduler's
// slots and the order endpoints.
func TestClusterOnZooKeeper(t *testing.T) {
	servers := drivertest.Addr(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181")
	before := zkOrderRecords(t, servers)
	runCluster(t, "sqlite://"+filepath.Join(t.TempDir(), "e2e.db"), "zk://"+servers)
	// The orders' idempotency records are on ZooKeeper, not in the orders
	// database.
	added := 0
	for name := range zkOrderRecords(t, servers) {
		if !before[name] {
			added++
		}
	}
	if added == 0 {
		t.Error("no idempotency record of an order appeared on ZooKeeper")
	}
}

// TestClusterOnConsul runs the cluster on Consul alone besides the orders
// database: its locks, and its idempotency store for the scheduler's slots
// and the order endpoints. Consul's sessions take TTLs of 10 s at least, so
// the lock TTL is 10 s: the killed replica's lock, and its slot's claim,
// come back when its session expires (10 to 20 s after the kill).
func TestClusterOnConsul(t *testing.T) {
	addr := drivertest.Addr(t, "WARDEN_CONSUL_ADDR", "127.0.0.1:18500")
	before := consulRecords(t, addr)
	runCluster(t, "sqlite://"+filepath.Join(t.TempDir(), "e2e.db"), "consul://"+addr, "-ttl", "10s")
	// The orders' idempotency records, and the job's slots, are on Consul,
	// not in the orders database.
	orders, slots := 0, 0
	for key := range consulRecords(t, addr) {
		switch {
		case before[key]:
		case strings.Contains(key, "e2e-") && strings.Contains(key, "-order-"):
			orders++
		case strings.HasPrefix(key, closeJob+"@"):
			slots++
		}
	}
	t.Logf("%d order records and %d slots written to Consul", orders, slots)
	if orders == 0 || slots == 0 {
		t.Errorf("%d order records and %d slots appeared on Consul; want some of each", orders, slots)
	}
}

// consulRecords returns the keys (without their scopes) of the idempotency
// records under consullock's default store prefix.
func consulRecords(t *testing.T, addr string) map[string]bool {
	t.Helper()
	cfg := consulapi.DefaultConfig()
	cfg.Address = addr
	c, err := consulapi.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	names, _, err := c.KV().Keys(consullock.DefaultStorePrefix, "/", nil)
	if err != nil {
		t.Fatalf("listing %s: %v", consullock.DefaultStorePrefix, err)
	}
	keys := map[string]bool{}
	for _, name := range names {
		// <prefix><base64url of uvarint(len(scope)), scope, key>
		b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(name, consullock.DefaultStorePrefix))
		if err != nil {
			continue // a chunk directory
		}
		if n, w := binary.Uvarint(b); w > 0 && uint64(len(b)-w) >= n {
			keys[string(b[w+int(n):])] = true
		}
	}
	return keys
}

// zkOrderRecords returns the names of the records under zklock's default
// store root that belong to this test's orders (their keys read e2e-...;
// node names keep such bytes as they are).
func zkOrderRecords(t *testing.T, servers string) map[string]bool {
	t.Helper()
	conn, _, err := zk.Connect(strings.Split(servers, ","), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	names := map[string]bool{}
	buckets, _, err := conn.Children(zklock.DefaultStoreRoot)
	if errors.Is(err, zk.ErrNoNode) {
		return names
	}
	if err != nil {
		t.Fatalf("listing %s: %v", zklock.DefaultStoreRoot, err)
	}
	for _, b := range buckets {
		records, _, err := conn.Children(zklock.DefaultStoreRoot + "/" + b)
		if err != nil {
			t.Fatalf("listing bucket %s: %v", b, err)
		}
		for _, r := range records {
			if strings.Contains(r, "e2e-") && strings.Contains(r, "-order-") {
				names[b+"/"+r] = true
			}
		}
	}
	return names
}

type replica struct {
	name  string
	cmd   *exec.Cmd
	url   string // the API: host:port
	admin string // the operator endpoints: host:port
	// banner is the line the service printed when it started listening.
	banner string
	// stderr is the file its log goes to.
	stderr string
}

func buildService(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "closeorder")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func startReplica(t *testing.T, bin, name string, args ...string) *replica {
	t.Helper()
	r, listening := launchReplica(t, bin, name, args...)
	listening(t)
	return r
}

// launchReplica starts a replica and returns it with the function that
// waits for it to listen and learns its addresses, so that several may be
// started at once.
func launchReplica(t *testing.T, bin, name string, args ...string) (*replica, func(*testing.T)) {
	t.Helper()
	r := &replica{name: name}
	r.cmd = exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-instance", name}, args...)...)
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stderr, r.stderr = stderr, stderr.Name()
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		r.cmd.Wait()
		if t.Failed() {
			logs, _ := os.ReadFile(stderr.Name())
			t.Logf("%s stderr (last 3000 bytes):\n%s", name, tail(logs, 3000))
		}
	})
	// The service prints its addresses once it listens:
	// "... listening on http://ADDR (...); admin on http://ADDR (...".
	lines := bufio.NewScanner(stdout)
	found := make(chan [3]string, 1)
	go func() {
		for lines.Scan() {
			_, api, ok := strings.Cut(lines.Text(), "listening on http://")
			if !ok {
				continue
			}
			var admin string
			if _, rest, ok := strings.Cut(api, "admin on http://"); ok {
				admin = strings.Fields(rest)[0]
			}
			found <- [3]string{strings.Fields(api)[0], admin, lines.Text()}
		}
		close(found)
	}()
	return r, func(t *testing.T) {
		t.Helper()
		select {
		case u, ok := <-found:
			if !ok {
				t.Fatalf("%s exited before listening", name)
			}
			r.url, r.admin, r.banner = u[0], u[1], u[2]
		case <-time.After(60 * time.Second):
			t.Fatalf("%s did not start listening within 60s", name)
		}
		go io.Copy(io.Discard, stdout)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func getJSON(t *testing.T, url string, v any) error { return getJSONAs(t, url, "", v) }

// getJSONAs gets url as user (none when "").
func getJSONAs(t *testing.T, url, user string, v any) error {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if user != "" {
		req.Header.Set("X-User-ID", user)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// e2eUsers is how many users the cluster tests' orders belong to.
const e2eUsers = 4

// getOrders lists at url what each of the tests' users sees (their own
// orders only), all together.
func getOrders[T any](t *testing.T, url string, out *[]T) error {
	t.Helper()
	*out = (*out)[:0]
	for i := range e2eUsers {
		var mine []T
		if err := getJSONAs(t, url, fmt.Sprintf("user-%d", i), &mine); err != nil {
			return err
		}
		*out = append(*out, mine...)
	}
	return nil
}

func waitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runCluster runs the cluster with the orders database db and the lock
// backend lock; extra flags come last, so they override the defaults.
func runCluster(t *testing.T, db, lock string, extra ...string) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	bin := buildService(t)
	args := []string{"-db", db, "-lock", lock, "-schedule", "@every 1s",
		"-unpaid-after", "300ms", "-work-delay", "200ms", "-ttl", "2s"}
	args = append(args, extra...)
	var replicas []*replica
	for i := range 3 {
		replicas = append(replicas, startReplica(t, bin, fmt.Sprintf("replica-%d", i+1), args...))
	}

	// Orders, created through all replicas; every one is retried once with
	// the same key, and must be answered from the store.
	const orders = 12
	client := &http.Client{Timeout: 10 * time.Second}
	// The idempotency store may be a server that outlives this test: keys
	// unique to the run keep an earlier run's records from answering.
	runID := time.Now().UnixNano()
	for i := range orders {
		body := fmt.Sprintf(`{"amount_cents": %d}`, 100+i)
		key := fmt.Sprintf("e2e-%d-order-%d", runID, i)
		var first []byte
		for attempt := range 2 {
			r := replicas[(i+attempt)%3]
			req, _ := http.NewRequest(http.MethodPost, "http://"+r.url+"/orders", strings.NewReader(body))
			req.Header.Set("X-User-ID", fmt.Sprintf("user-%d", i%e2eUsers))
			req.Header.Set("Idempotency-Key", key)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("POST /orders (attempt %d): %s %s", attempt, resp.Status, got)
			}
			if attempt == 0 {
				if resp.Header.Get("Idempotent-Replayed") != "" {
					t.Fatalf("first POST of %s was answered as a replay", key)
				}
				first = got
			} else if resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(got, first) {
				t.Fatalf("retry of %s not replayed byte for byte: replayed=%q\n%s\n%s", key, resp.Header.Get("Idempotent-Replayed"), first, got)
			}
		}
	}

	// Kill the replica running the close job once it has closed something.
	type run struct {
		Job        string     `json:"job"`
		Instance   string     `json:"instance"`
		Token      uint64     `json:"token"`
		StartedAt  time.Time  `json:"started_at"`
		FinishedAt *time.Time `json:"finished_at"`
		Outcome    string     `json:"outcome"`
	}
	type order struct {
		ID          int64      `json:"id"`
		Status      string     `json:"status"`
		ClosedAt    *time.Time `json:"closed_at"`
		ClosedBy    *string    `json:"closed_by"`
		ClosedToken *uint64    `json:"closed_token"`
	}
	var victim *replica
	var killedAt time.Time
	waitUntil(t, "a replica is running the close job after closing an order", 60*time.Second, func() bool {
		var closed []order
		var runs []run
		if getOrders(t, "http://"+replicas[0].url+"/orders?status=closed", &closed) != nil || len(closed) == 0 ||
			getJSON(t, "http://"+replicas[0].admin+"/jobs/runs?limit=20", &runs) != nil {
			return false
		}
		for _, r := range runs {
			if r.FinishedAt == nil && r.Outcome == "running" {
				for _, rep := range replicas {
					if rep.name == r.Instance {
						victim = rep
					}
				}
				return victim != nil
			}
		}
		return false
	})
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	victim.cmd.Wait()
	killedAt = time.Now()
	var survivor *replica
	for _, r := range replicas {
		if r != victim {
			survivor = r
			break
		}
	}
	t.Logf("killed %s while it ran the close job", victim.name)

	var all []order
	waitUntil(t, "every order is closed by the surviving replicas", 60*time.Second, func() bool {
		all = nil
		if getOrders(t, "http://"+survivor.url+"/orders", &all) != nil || len(all) != orders {
			return false
		}
		for _, o := range all {
			if o.Status != statusClosed {
				return false
			}
		}
		return true
	})
	var runs []run
	if err := getJSON(t, "http://"+survivor.admin+"/jobs/runs?limit=10000", &runs); err != nil {
		t.Fatal(err)
	}
	// The debug page answers, and lists the close job.
	var debug struct {
		Owner string `json:"owner"`
		Jobs  []struct {
			Name string `json:"name"`
		} `json:"jobs"`
	}
	if err := getJSON(t, "http://"+survivor.admin+"/debug/warden?format=json", &debug); err != nil || debug.Owner != survivor.name ||
		len(debug.Jobs) != 1 || debug.Jobs[0].Name != closeJob {
		t.Errorf("debug page: %+v, %v; want the replica's instance, %s, as its locks' owner, and the %s job", debug, err, survivor.name, closeJob)
	}

	// Each order closed once, by a run of the instance it names, with that
	// run's token.
	runOf := map[uint64]run{}
	for _, r := range runs {
		if r.Token != 0 && r.Outcome != "skipped" && r.Outcome != "misfired" {
			if prev, dup := runOf[r.Token]; dup {
				t.Errorf("two runs share token %d: %+v and %+v", r.Token, prev, r)
			}
			runOf[r.Token] = r
		}
	}
	closedByOthers := 0
	for _, o := range all {
		if o.ClosedToken == nil || o.ClosedBy == nil || o.ClosedAt == nil {
			t.Fatalf("order %d closed without its closing run: %+v", o.ID, o)
		}
		r, ok := runOf[*o.ClosedToken]
		if !ok || r.Instance != *o.ClosedBy {
			t.Errorf("order %d closed by %s with token %d, which no run of that instance holds", o.ID, *o.ClosedBy, *o.ClosedToken)
		}
		if *o.ClosedBy != victim.name {
			closedByOthers++
		}
	}
	if closedByOthers == 0 {
		t.Error("no order was closed after the kill: the job did not move to another replica")
	}
	// Tokens fit the order of the writes: a later close never carries an
	// older token.
	slices.SortFunc(all, func(a, b order) int { return a.ClosedAt.Compare(*b.ClosedAt) })
	for i := 1; i < len(all); i++ {
		if *all[i].ClosedToken < *all[i-1].ClosedToken {
			t.Errorf("order %d closed at %v with token %d after order %d closed with token %d",
				all[i].ID, all[i].ClosedAt, *all[i].ClosedToken, all[i-1].ID, *all[i-1].ClosedToken)
		}
	}
	// No two runs overlapped. The killed run has no finish: it ended when
	// its process died.
	type span struct {
		r          run
		start, end time.Time
	}
	var spans []span
	for _, r := range runs {
		switch {
		case r.Outcome == "running" && r.Instance == victim.name:
			spans = append(spans, span{r, r.StartedAt, killedAt})
		case r.Outcome == "running":
			// still running on a survivor: open-ended
			spans = append(spans, span{r, r.StartedAt, time.Now()})
		case r.Outcome == "ran" || r.Outcome == "failed" || r.Outcome == "lost":
			spans = append(spans, span{r, r.StartedAt, *r.FinishedAt})
		}
	}
	for i := range spans {
		for j := i + 1; j < len(spans); j++ {
			a, b := spans[i], spans[j]
			if a.start.Before(b.end) && b.start.Before(a.end) {
				t.Errorf("runs overlapped: %s token %d [%v, %v] and %s token %d [%v, %v]",
					a.r.Instance, a.r.Token, a.start, a.end, b.r.Instance, b.r.Token, b.start, b.end)
			}
		}
	}
	t.Logf("%d orders closed (%d after the kill), %d runs recorded", len(all), closedByOthers, len(spans))
}

// TestRefusedRequestKeepsItsKey: a POST /orders refused by validation uses
// up nothing, so the corrected retry with the same Idempotency-Key creates
// the order, and a repeat of it replays that order.
func TestRefusedRequestKeepsItsKey(t *testing.T) {
	bin := buildService(t)
	r := startReplica(t, bin, "solo", "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"), "-lock", "memory")
	post := func(body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.url+"/orders", strings.NewReader(body))
		req.Header.Set("X-User-ID", "user-1")
		req.Header.Set("Idempotency-Key", "fix-and-retry")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post(`{"amount_cents": 0}`); code != http.StatusBadRequest {
		t.Fatalf("amount 0: %d %s, want 400", code, body)
	}
	code, created := post(`{"amount_cents": 250}`)
	if code != http.StatusCreated {
		t.Fatalf("the corrected retry with the same key: %d %s, want 201", code, created)
	}
	if code, again := post(`{"amount_cents": 250}`); code != http.StatusCreated || again != created {
		t.Fatalf("a repeat: %d %s, want the replay of %s", code, again, created)
	}
}

// TestOrdersAreTheCallersOwn: GET /orders and GET /orders/{id} answer only
// the caller's orders; without X-User-ID they answer 401.
func TestOrdersAreTheCallersOwn(t *testing.T) {
	bin := buildService(t)
	r := startReplica(t, bin, "own", "-db", "sqlite://"+filepath.Join(t.TempDir(), "orders.db"), "-lock", "memory")
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.url+"/orders", strings.NewReader(`{"amount_cents": 300}`))
	req.Header.Set("X-User-ID", "alice")
	req.Header.Set("Idempotency-Key", "alice-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID int64 `json:"id"`
	}
	json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || created.ID == 0 {
		t.Fatalf("POST /orders: %s", resp.Status)
	}
	var mine, theirs []struct {
		ID int64 `json:"id"`
	}
	if err := getJSONAs(t, "http://"+r.url+"/orders", "alice", &mine); err != nil || len(mine) != 1 || mine[0].ID != created.ID {
		t.Fatalf("alice's list: %v, %v", mine, err)
	}
	if err := getJSONAs(t, "http://"+r.url+"/orders", "mallory", &theirs); err != nil || len(theirs) != 0 {
		t.Fatalf("mallory's list: %v, %v; want nothing of alice's", theirs, err)
	}
	one := fmt.Sprintf("http://%s/orders/%d", r.url, created.ID)
	if err := getJSONAs(t, one, "mallory", &struct{}{}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("mallory reading alice's order: %v, want 404", err)
	}
	if err := getJSONAs(t, one, "", &struct{}{}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("an anonymous read: %v, want 401", err)
	}
}

// TestReplicasStartTogether starts three replicas at once on a PostgreSQL
// schema nobody has migrated, as a new deployment does, five times: every
// replica must come up. Each creates the tables it finds missing; without
// the migration under the cluster's lock, two of three replicas failed to
// start in about one round of three ("relation \"orders\" already exists",
// or a duplicate key in pg_type).
func TestReplicasStartTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	const env = "WARDEN_POSTGRES_DSN"
	dsn := os.Getenv(env)
	if dsn == "" {
		dsn = "postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable"
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err == nil {
		err = db.Exec("SELECT 1").Error
	}
	if err != nil {
		drivertest.Unreachable(t, env, dsn, err)
	}
	redis := drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	bin := buildService(t)
	for round := range 5 {
		schema := fmt.Sprintf("closeorder_start_%d_%d", os.Getpid(), round)
		if err := db.Exec("CREATE SCHEMA " + schema).Error; err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Exec("DROP SCHEMA " + schema + " CASCADE") })
		// The job never fires while the replicas live: only their start
		// is tested.
		args := []string{"-db", dsn + "&search_path=" + schema, "-lock", "redis://" + redis + "/5", "-schedule", "@every 1h"}
		var waits []func(*testing.T)
		for i := range 3 {
			_, listening := launchReplica(t, bin, fmt.Sprintf("round-%d-replica-%d", round, i+1), args...)
			waits = append(waits, listening)
		}
		for _, listening := range waits {
			listening(t)
		}
	}
}

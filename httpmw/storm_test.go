package httpmw_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// stormWorkerEnv carries a storm worker's spec, as JSON, to the test binary
// run again as a server process.
const stormWorkerEnv = "WARDEN_HTTPMW_STORM_WORKER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(stormWorkerEnv); spec != "" {
		os.Exit(runStormWorker(spec))
	}
	os.Exit(m.Run())
}

// The retry storm: a client whose timeout is shorter than the handler gives
// up on every first attempt and retries with the same key, round the
// servers, until it gets an answer.
const (
	storms        = 50
	stormServers  = 4
	stormParallel = 10
	clientTimeout = 100 * time.Millisecond
	// maxClientTimeout caps the client's timeout, which doubles after each
	// attempt it gave up on, as a retrying client backs off: on a machine
	// so loaded that no answer comes within 100 ms, a client that never
	// waited longer would give up on every attempt, forever.
	maxClientTimeout = 16 * clientTimeout
	// handlerTime is how long the handler takes to answer after it has
	// committed the order: three client timeouts.
	handlerTime = 300 * time.Millisecond
	// stormPatience bounds one storm; only a broken middleware reaches it.
	stormPatience = 30 * time.Second
)

// stormSpec is what one server process is told.
type stormSpec struct {
	// Backend is "redis" or "postgres"; Addr its address or DSN.
	Backend string `json:"backend"`
	Addr    string `json:"addr"`
	// Name prefixes the run's Redis keys, or names its tables.
	Name string `json:"name"`
}

// stormBackend is one run's store and order book on a backend.
type stormBackend struct {
	store idempotency.Store
	// order commits an order for key and returns its number.
	order func(ctx context.Context, key string) (int64, error)
	// counts returns how many orders each key got.
	counts func(ctx context.Context) (map[string]int64, error)
	// drop removes what the run created.
	drop  func(ctx context.Context)
	close func()
}

// openStormBackend opens sp's backend with a client of its own.
func openStormBackend(ctx context.Context, sp stormSpec) (*stormBackend, error) {
	switch sp.Backend {
	case "redis":
		c := goredis.NewClient(&goredis.Options{Addr: sp.Addr})
		st, err := redislock.NewStore(c, redislock.WithStorePrefix(sp.Name+"idem:"))
		if err != nil {
			return nil, err
		}
		orders := sp.Name + "orders"
		return &stormBackend{
			store: st,
			order: func(ctx context.Context, key string) (int64, error) { return c.HIncrBy(ctx, orders, key, 1).Result() },
			counts: func(ctx context.Context) (map[string]int64, error) {
				m, err := c.HGetAll(ctx, orders).Result()
				out := make(map[string]int64, len(m))
				for k, v := range m {
					var n int64
					fmt.Sscan(v, &n)
					out[k] = n
				}
				return out, err
			},
			drop: func(ctx context.Context) {
				keys, _ := c.Keys(ctx, sp.Name+"*").Result()
				if len(keys) > 0 {
					c.Del(ctx, keys...)
				}
			},
			close: func() { c.Close() },
		}, nil
	case "postgres":
		db, err := gorm.Open(postgres.Open(sp.Addr), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			return nil, err
		}
		pool, err := db.DB()
		if err != nil {
			return nil, err
		}
		st, err := sqllock.NewStore(db, sqllock.WithStoreTable(sp.Name+"_idem"))
		if err != nil {
			pool.Close()
			return nil, err
		}
		orders := sp.Name + "_orders"
		return &stormBackend{
			store: st,
			order: func(ctx context.Context, key string) (int64, error) {
				var id int64
				err := db.WithContext(ctx).Raw("INSERT INTO "+orders+" (idem_key) VALUES (?) RETURNING id", key).Scan(&id).Error
				return id, err
			},
			counts: func(ctx context.Context) (map[string]int64, error) {
				var rows []struct {
					IdemKey string
					N       int64
				}
				err := db.WithContext(ctx).Raw("SELECT idem_key, count(*) AS n FROM " + orders + " GROUP BY idem_key").Scan(&rows).Error
				out := make(map[string]int64, len(rows))
				for _, r := range rows {
					out[r.IdemKey] = r.N
				}
				return out, err
			},
			drop: func(ctx context.Context) {
				db.WithContext(ctx).Exec("DROP TABLE IF EXISTS " + orders)
				db.WithContext(ctx).Exec("DROP TABLE IF EXISTS " + sp.Name + "_idem")
			},
			close: func() { pool.Close() },
		}, nil
	}
	return nil, fmt.Errorf("unknown backend %q", sp.Backend)
}

// runStormWorker is a server process: the Idempotency middleware over its
// own client of the store, in front of a handler that commits an order and
// answers only handlerTime later. It prints its address, serves until its
// stdin closes, then exits 0.
func runStormWorker(raw string) int {
	var sp stormSpec
	if err := json.Unmarshal([]byte(raw), &sp); err != nil {
		fmt.Fprintf(os.Stderr, "storm worker: bad spec: %v\n", err)
		return 2
	}
	ctx := context.Background()
	b, err := openStormBackend(ctx, sp)
	if err != nil {
		fmt.Fprintf(os.Stderr, "storm worker: %v\n", err)
		return 2
	}
	defer b.close()
	mw, err := httpmw.Idempotency(b.store, httpmw.WithRequireKey())
	if err != nil {
		fmt.Fprintf(os.Stderr, "storm worker: %v\n", err)
		return 2
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := httpmw.KeyFromContext(r.Context())
		id, err := b.order(r.Context(), key)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// The answer is slower than the client's patience: the order is
		// committed, the client has gone by the time it is sent.
		time.Sleep(handlerTime)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", id)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "storm worker: %v\n", err)
		return 2
	}
	srv := &http.Server{Handler: mw(h)}
	go srv.Serve(ln)
	fmt.Println(ln.Addr().String())
	// The parent closing our stdin is the order to stop; a parent that
	// dies closes it too.
	io.Copy(io.Discard, os.Stdin)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	return 0
}

// startStormWorker runs the test binary again as a server process and
// returns its URL; the process is stopped when t ends.
func startStormWorker(t *testing.T, sp stormSpec) string {
	t.Helper()
	raw, _ := json.Marshal(sp)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stormWorkerEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("storm worker: %v", err)
		}
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("storm worker gave no address: %v", err)
	}
	return "http://" + strings.TrimSpace(addr)
}

// stormServer returns the address of backend's test server from the
// environment, or skips (fails under WARDEN_REQUIRE_SERVERS=1) without one.
func stormServer(t *testing.T, env string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	if os.Getenv("WARDEN_REQUIRE_SERVERS") == "1" {
		t.Fatalf("%s is not set and WARDEN_REQUIRE_SERVERS=1", env)
	}
	t.Skipf("%s is not set", env)
	return ""
}

// stormFigures counts what the clients saw.
type stormFigures struct {
	attempts, timeouts, inProgress, answers atomic.Int64
}

// TestRetryStormsOneOrderPerKey: 50 retry storms, each a client whose
// first timeout (100 ms) is shorter than the handler (300 ms) retrying one key
// round four server processes, each with its own client of the store, on
// Redis and on PostgreSQL: every key gets exactly one order, and every
// client ends with that order's answer.
func TestRetryStormsOneOrderPerKey(t *testing.T) {
	for _, tc := range []struct{ backend, env string }{
		{"redis", "WARDEN_REDIS_ADDR"},
		{"postgres", "WARDEN_POSTGRES_DSN"},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			sp := stormSpec{Backend: tc.backend, Addr: stormServer(t, tc.env),
				Name: fmt.Sprintf("warden_test_storm_%d_%d", os.Getpid(), time.Now().UnixNano())}
			if tc.backend == "redis" {
				sp.Name += ":"
			}
			ctx := context.Background()
			b, err := openStormBackend(ctx, sp)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.close)
			t.Cleanup(func() { b.drop(context.Background()) })
			if tc.backend == "postgres" {
				st := b.store.(*sqllock.Store)
				if err := st.Migrate(ctx); err != nil {
					t.Fatalf("Migrate: %v", err)
				}
				db, _ := gorm.Open(postgres.Open(sp.Addr), &gorm.Config{Logger: logger.Discard})
				if err := db.Exec("CREATE TABLE " + sp.Name + "_orders (id bigserial PRIMARY KEY, idem_key text NOT NULL)").Error; err != nil {
					t.Fatal(err)
				}
				if pool, err := db.DB(); err == nil {
					pool.Close()
				}
			}
			urls := make([]string, stormServers)
			for i := range urls {
				urls[i] = startStormWorker(t, sp)
			}
			clients := make([]*http.Client, stormServers)
			for i := range clients {
				clients[i] = &http.Client{Transport: &http.Transport{}}
			}
			var f stormFigures
			answers := make([]string, storms)
			start := time.Now()
			var wg sync.WaitGroup
			sem := make(chan struct{}, stormParallel)
			for s := range storms {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					answers[s] = storm(t, clients, urls, fmt.Sprintf("storm-%d", s), s, &f)
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			counts, err := b.counts(ctx)
			if err != nil {
				t.Fatalf("counting orders: %v", err)
			}
			var total int64
			for s := range storms {
				k := fmt.Sprintf("storm-%d", s)
				total += counts[k]
				if counts[k] != 1 {
					t.Errorf("key %s: %d orders, want 1", k, counts[k])
				}
				if !strings.HasPrefix(answers[s], "order ") {
					t.Errorf("key %s: the client ended with %q, want its order", k, answers[s])
				}
			}
			if f.timeouts.Load() < storms {
				t.Errorf("%d client timeouts in %d storms: the clients did not give up on the first attempts", f.timeouts.Load(), storms)
			}
			t.Logf("%s: %d storms over %d processes in %v: %d attempts, %d client timeouts, %d answered 409 in progress, %d answered; %d orders for %d keys",
				tc.backend, storms, stormServers, elapsed.Round(time.Millisecond), f.attempts.Load(), f.timeouts.Load(), f.inProgress.Load(), f.answers.Load(), total, storms)
		})
	}
}

// storm retries key round the servers, starting at the first-th, until it
// gets the order's answer, and returns that answer's body.
func storm(t *testing.T, clients []*http.Client, urls []string, key string, first int, f *stormFigures) string {
	deadline := time.Now().Add(stormPatience)
	timeout := clientTimeout
	for attempt := first; time.Now().Before(deadline); attempt++ {
		i := attempt % len(urls)
		f.attempts.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urls[i]+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		resp, err := clients[i].Do(req)
		if err != nil {
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("key %s: %v", key, err)
				return ""
			}
			f.timeouts.Add(1)
			timeout = min(2*timeout, maxClientTimeout)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		timedOut := ctx.Err() != nil
		cancel()
		switch {
		case err != nil && timedOut:
			f.timeouts.Add(1)
			timeout = min(2*timeout, maxClientTimeout)
		case err != nil:
			t.Errorf("key %s: reading the answer: %v", key, err)
			return ""
		case resp.StatusCode == http.StatusConflict && strings.Contains(string(body), "In_progress"):
			f.inProgress.Add(1)
			// A client backing off before its next try, as Retry-After
			// asks (shortened: the storm is about retries).
			time.Sleep(20 * time.Millisecond)
		case resp.StatusCode == http.StatusCreated:
			f.answers.Add(1)
			return string(body)
		default:
			t.Errorf("key %s: %d %q", key, resp.StatusCode, body)
			return ""
		}
	}
	t.Errorf("key %s: no answer within %v", key, stormPatience)
	return ""
}

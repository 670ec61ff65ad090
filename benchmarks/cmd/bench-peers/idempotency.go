package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
)

// idemTable is the benchmark's own idempotency table on PostgreSQL.
const idemTable = "bench_peers_idempotency"

// idemWorkers is how many clients send keyed requests at once, each on a
// connection of its own.
const idemWorkers = 8

// idemRetention keeps the benchmark's records just long enough: the next
// run purges what this one left.
const idemRetention = time.Minute

// idemStore is an idempotency store the middleware is measured over.
type idemStore struct {
	group string // whose servers it needs
	label string
	// open makes the store on clients counted into m, with its records
	// under prefix where the store has prefixes.
	open func(ctx context.Context, m *meter, prefix string) (idempotency.Store, closers, error)
}

func (b *bench) idemStores() []idemStore {
	return []idemStore{
		{group: "redis", label: "redislock.Store (Redis)", open: func(ctx context.Context, m *meter, prefix string) (idempotency.Store, closers, error) {
			var cl closers
			c := newRedisClient(b.srv.redis, m)
			cl.add(func() { c.Close() })
			st, err := redislock.NewStore(c, redislock.WithStorePrefix(prefix))
			return st, cl, err
		}},
		{group: "postgres", label: "sqllock.Store (PostgreSQL)", open: func(ctx context.Context, m *meter, _ string) (idempotency.Store, closers, error) {
			var cl closers
			db, err := openGorm(b.srv.postgres, m, workerConns)
			if err != nil {
				return nil, cl, err
			}
			cl.add(func() { closeGorm(db) })
			st, err := sqllock.NewStore(db, sqllock.WithStoreTable(idemTable))
			return st, cl, err
		}},
		{group: "etcd", label: "etcdlock.Store (etcd)", open: func(ctx context.Context, m *meter, prefix string) (idempotency.Store, closers, error) {
			var cl closers
			c, err := clientv3.New(clientv3.Config{
				Endpoints: b.srv.etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
				DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
					func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
						m.sent(method)
						return invoker(ctx, method, req, reply, cc, opts...)
					})},
			})
			if err != nil {
				return nil, cl, err
			}
			cl.add(func() { c.Close() })
			st, err := etcdlock.NewStore(c, etcdlock.WithStorePrefix(prefix))
			return st, cl, err
		}},
	}
}

// idemResult is one window of keyed requests.
type idemResult struct {
	rps      float64 // requests per second
	p50, p99 float64 // ms, client-side
	trips    float64 // store round trips per request; NaN when not counted
	cmds     float64 // Redis: server commands per request
	foreign  bool
}

func (r idemResult) String() string {
	return fmt.Sprintf("%8.0f req/s  p50 %s  p99 %s  trips/request %.2f  cmds/request %.2f", r.rps, ms(r.p50), ms(r.p99), r.trips, r.cmds)
}

// idemKey names the figures of one store and phase.
type idemKey struct {
	store string
	phase string // "plain", "first", "replay"
}

var idemPhases = []string{"plain", "first", "replay"}

// idempotent measures one store: the same handler unguarded, then keyed
// requests that run it (each key new), then retries of those keys, which
// replay.
func (b *bench) idempotent(ctx context.Context, st idemStore, rep int) (map[string]idemResult, error) {
	kind := countNothing
	switch st.group {
	case "redis":
		kind = countRedis
	case "postgres":
		kind = countSQL
	case "etcd":
		kind = countSQL // unary RPCs, counted as statements are: one round trip each
	}
	var servers []string
	if st.group == "redis" {
		servers = []string{b.srv.redis}
	}
	m := newMeter(kind, b.admin, servers)
	prefix := fmt.Sprintf("bench-peers/%s/idem/r%d", b.id, rep)
	store, cl, err := st.open(ctx, m, prefix)
	defer cl.close()
	if err != nil {
		return nil, err
	}
	if s, ok := store.(*sqllock.Store); ok {
		if err := s.Migrate(ctx); err != nil {
			return nil, err
		}
		if _, err := s.Purge(ctx); err != nil {
			return nil, err
		}
	}
	mw, err := httpmw.Idempotency(store, httpmw.WithRetention(idemRetention))
	if err != nil {
		return nil, err
	}
	var ran atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		ran.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"order-42","status":"created","amount_cents":1234}`)
	})
	mux := http.NewServeMux()
	mux.Handle("/plain", handler)
	mux.Handle("/guarded", mw(handler))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	keys := make([][]string, idemWorkers) // each worker's first-request keys, replayed after
	out := map[string]idemResult{}
	for _, phase := range idemPhases {
		ran.Store(0)
		before, err := m.snapshot(ctx)
		if err != nil {
			return nil, err
		}
		requests, samples, elapsed, err := b.idemWindow(ctx, srv.URL, phase, keys)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", phase, err)
		}
		after, err := m.snapshot(ctx)
		if err != nil {
			return nil, err
		}
		switch want := int64(requests); {
		case phase == "replay" && ran.Load() != 0:
			return nil, fmt.Errorf("replay: the handler ran %d times for %d retries", ran.Load(), requests)
		case phase != "replay" && ran.Load() != want:
			return nil, fmt.Errorf("%s: the handler ran %d times for %d requests", phase, ran.Load(), requests)
		}
		wk := m.between(before, after)
		r := idemResult{
			rps:     float64(requests) / elapsed.Seconds(),
			p50:     quantile(samples, 0.5),
			p99:     quantile(samples, 0.99),
			trips:   wk.trips / float64(requests),
			cmds:    wk.cmds / float64(requests),
			foreign: wk.foreign,
		}
		if kind != countRedis {
			r.cmds = math.NaN()
		}
		out[phase] = r
	}
	return out, nil
}

// idemWindow sends requests from idemWorkers clients for the contended
// window: plain ones, keyed ones with a new key each (noted in keys), or
// retries of the noted keys in turn. It checks every answer.
func (b *bench) idemWindow(ctx context.Context, url, phase string, keys [][]string) (int, []float64, time.Duration, error) {
	body := []byte(`{"customer":"c-7","amount_cents":1234}`)
	path := "/guarded"
	if phase == "plain" {
		path = "/plain"
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		samples []float64
		count   int
		first   error
	)
	start := time.Now()
	deadline := start.Add(b.s.contended)
	for i := range idemWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{MaxIdleConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			var mine []float64
			var err error
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				key := fmt.Sprintf("w%d-%d", i, n)
				switch phase {
				case "replay":
					if len(keys[i]) == 0 {
						err = fmt.Errorf("worker %d has no key to retry", i)
					} else {
						key = keys[i][n%len(keys[i])]
					}
				case "first":
					keys[i] = append(keys[i], key)
				}
				if err != nil {
					break
				}
				t0 := time.Now()
				err = idemRequest(ctx, client, url+path, key, body, phase == "replay")
				if err != nil {
					break
				}
				mine = append(mine, durMS(time.Since(t0)))
			}
			mu.Lock()
			defer mu.Unlock()
			samples = append(samples, mine...)
			count += len(mine)
			if err != nil && first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	if first == nil && count == 0 {
		first = fmt.Errorf("no request completed in %v", b.s.contended)
	}
	return count, samples, time.Since(start), first
}

// idemRequest sends one keyed POST and checks its answer: 201, and on a
// retry the replay header.
func idemRequest(ctx context.Context, c *http.Client, url, key string, body []byte, replay bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(httpmw.DefaultHeader, strconv.Quote(key))
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("key %s: status %d", key, resp.StatusCode)
	}
	if got := resp.Header.Get("Idempotent-Replayed") == "true"; got != replay {
		return fmt.Errorf("key %s: Idempotent-Replayed %v, want %v", key, got, replay)
	}
	return nil
}

// idemSection writes the middleware's figures: each store's keyed requests
// beside the same handler unguarded, from the same run.
func (b *bench) idemSection(w func(string, ...any)) {
	if !b.ran("idempotency") || len(b.res.idem) == 0 {
		return
	}
	w("## 4. Idempotent requests\n\n")
	w("An HTTP handler that answers 201 with a small JSON body, on a loopback server, called by %d clients at once (each its own connection) for %v per repetition: unguarded, then through `httpmw.Idempotency` with a new key on every request (the handler runs; the store claims and completes), then retrying those keys (the store replays; the handler does not run, which is checked). ", idemWorkers, b.s.contended)
	w("Added latency is the guarded p50 or p99 less the unguarded one. Store round trips are counted on the store's own client (go-redis hook, pgx tracer, etcd unary RPCs); the targets are 2 per first request (claim, complete) and 1 per replay.\n\n")
	w("| store | requests | requests/s ↑ (÷ unguarded) | p50 | p99 | added p50 ↓ | added p99 ↓ | store round trips/request ↓ | Redis commands/request ↓ |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, st := range b.idemStores() {
		plain := b.idemMedian(idemKey{st.label, "plain"})
		if plain.reps == 0 {
			continue
		}
		w("| %s | unguarded | %s | %s | %s | — | — | — | — |\n", st.label, fmtCount(plain.rps), ms(plain.p50), ms(plain.p99))
		for _, phase := range []string{"first", "replay"} {
			r := b.idemMedian(idemKey{st.label, phase})
			name := map[string]string{"first": "first (runs)", "replay": "retry (replays)"}[phase]
			cmds := fmtCount(r.cmds)
			if r.foreign {
				cmds += " †"
			}
			w("| %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s |\n", st.label, name,
				fmtCount(r.rps), fmtRatio(ratio(r.rps, plain.rps)), ms(r.p50), ms(r.p99),
				ms(r.p50-plain.p50), ms(r.p99-plain.p99), fmtCount(r.trips), cmds)
		}
	}
	w("\n")
}

type idemMedians struct {
	idemResult
	reps int
}

func (b *bench) idemMedian(k idemKey) idemMedians {
	rs := b.res.idem[k]
	m := idemMedians{reps: len(rs)}
	m.rps = median(rs, func(r idemResult) float64 { return r.rps })
	m.p50 = median(rs, func(r idemResult) float64 { return r.p50 })
	m.p99 = median(rs, func(r idemResult) float64 { return r.p99 })
	m.trips = median(rs, func(r idemResult) float64 { return r.trips })
	m.cmds = median(rs, func(r idemResult) float64 { return r.cmds })
	for _, r := range rs {
		m.foreign = m.foreign || r.foreign
	}
	return m
}

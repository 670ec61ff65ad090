package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// counting says what a meter can count for a subject.
type counting int

const (
	countNothing counting = iota // etcd, ZooKeeper, in-process: no figures
	countRedis                   // go-redis hooks, and the servers' INFO commandstats
	countSQL                     // statements, through a pgx tracer
	countHTTP                    // Consul: HTTP requests, through the client's transport
)

// meter counts the work of one measurement: the round trips and commands
// its clients send, and for Redis the commands the servers ran, which also
// counts the commands a Lua script runs inside the server.
type meter struct {
	kind  counting
	admin *admin
	redis []string

	trips atomic.Int64
	mu    sync.Mutex
	names map[string]int64 // commands sent, by name
}

func newMeter(kind counting, a *admin, redis []string) *meter {
	return &meter{kind: kind, admin: a, redis: redis, names: map[string]int64{}}
}

// sent counts one round trip carrying the named commands.
func (m *meter) sent(names ...string) {
	m.trips.Add(1)
	m.mu.Lock()
	for _, n := range names {
		m.names[n]++
	}
	m.mu.Unlock()
}

type snapshot struct {
	trips  int64
	names  map[string]int64
	server map[string]int64 // commands run, by name, summed over the servers
}

func (m *meter) snapshot(ctx context.Context) (snapshot, error) {
	s := snapshot{trips: m.trips.Load()}
	m.mu.Lock()
	s.names = make(map[string]int64, len(m.names))
	for k, v := range m.names {
		s.names[k] = v
	}
	m.mu.Unlock()
	if m.kind == countRedis {
		var err error
		if s.server, err = m.admin.commandStats(ctx, m.redis); err != nil {
			return s, err
		}
	}
	return s, nil
}

// work is what one window cost.
type work struct {
	trips float64 // round trips (a pipeline is one); NaN when not counted
	cmds  float64 // commands the servers ran (PostgreSQL: statements); NaN when not counted
	// foreign: the servers ran more of the commands this subject sends than
	// it sent, so another client was using them during the window and cmds
	// is an upper bound.
	foreign bool
}

func (m *meter) between(a, b snapshot) work {
	w := work{trips: math.NaN(), cmds: math.NaN()}
	switch m.kind {
	case countSQL, countHTTP:
		w.trips = float64(b.trips - a.trips)
		w.cmds = w.trips
	case countRedis:
		w.trips = float64(b.trips - a.trips)
		var total int64
		for name, n := range b.server {
			// Our own INFO, and anyone else's, is not the subject's.
			if name != "info" {
				total += n - a.server[name]
			}
		}
		w.cmds = float64(total)
		// A script runs commands inside the server that its caller did not
		// send (a GET, a TIME): while the subject sends scripts, only the
		// commands no script can run tell another client apart, and another
		// client sending only plain commands goes unnoticed.
		scripts := false
		for name, n := range b.names {
			scripts = scripts || runsScripts(name) && n > a.names[name]
		}
		for name, n := range b.names {
			if scripts && !runsScripts(name) {
				continue
			}
			sent := n - a.names[name]
			ran := b.server[name] - a.server[name]
			if ran > sent+max(2, sent/100) {
				w.foreign = true
			}
		}
	}
	return w
}

// runsScripts says whether a command runs a script; no script can run one.
func runsScripts(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

// redisHook counts what a go-redis client sends into a meter.
type redisHook struct{ m *meter }

func (h redisHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h redisHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.m.sent(cmd.Name())
		return next(ctx, cmd)
	}
}

func (h redisHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		h.m.sent(names...)
		return next(ctx, cmds)
	}
}

// admin holds one uncounted client per Redis server, to read its statistics
// and clean up after the run.
type admin struct {
	mu      sync.Mutex
	clients map[string]*goredis.Client
}

func newAdmin() *admin { return &admin{clients: map[string]*goredis.Client{}} }

func (a *admin) client(addr string) *goredis.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.clients[addr]
	if !ok {
		c = goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 2})
		a.clients[addr] = c
	}
	return c
}

// prepareRedis checks every server answers and returns their version.
func (a *admin) prepareRedis(ctx context.Context, addrs []string, label string) (string, error) {
	version := ""
	for _, addr := range addrs {
		info, err := a.client(addr).Info(ctx, "server").Result()
		if err != nil {
			return "", fmt.Errorf("redis %s: %w", addr, err)
		}
		if v := infoField(info, "redis_version"); v != "" {
			version = v
		}
	}
	return fmt.Sprintf("%s %s (%s)", label, version, strings.Join(addrs, ", ")), nil
}

func infoField(info, field string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), field+":"); ok {
			return v
		}
	}
	return ""
}

// commandStats sums INFO commandstats' calls by command over addrs.
func (a *admin) commandStats(ctx context.Context, addrs []string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, addr := range addrs {
		info, err := a.client(addr).Info(ctx, "commandstats").Result()
		if err != nil {
			return nil, fmt.Errorf("redis %s: INFO commandstats: %w", addr, err)
		}
		sc := bufio.NewScanner(strings.NewReader(info))
		for sc.Scan() {
			line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "cmdstat_")
			if !ok {
				continue
			}
			name, fields, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			for _, f := range strings.Split(fields, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, err := strconv.ParseInt(v, 10, 64)
					if err == nil {
						out[name] += n
					}
				}
			}
		}
	}
	return out, nil
}

// deleteKeys removes the keys whose names contain prefix: warden's fence
// counters never expire by design, and a benchmark must not leave
// thousands of them behind.
func (a *admin) deleteKeys(ctx context.Context, addrs []string, prefix string) {
	for _, addr := range addrs {
		c := a.client(addr)
		iter := c.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 500 {
				c.Unlink(ctx, batch...)
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			c.Unlink(ctx, batch...)
		}
	}
}

func (a *admin) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.clients {
		c.Close()
	}
}

// settle waits for d or until ctx is done.
func settle(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

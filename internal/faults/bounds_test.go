//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/consullock"
	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/backends/redlock"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// Bounds against servers that do not answer: every Guard call made through
// a client with its library's default options (no dial or read timeouts of
// our own, default retries) against a closed port and against a server that
// accepts connections and then answers nothing must return within its
// bound and boundSlack, and report the backend unavailable, never the lock
// as held.

const (
	// boundWait is every call's bound: the wait bound, ctx's deadline, and
	// the Guard's call timeout alike.
	boundWait = time.Second
	// boundSlack is what a call may take past its bound here: guard's grace
	// (20ms) and room for a loaded machine.
	boundSlack = 200 * time.Millisecond
)

// boundsRow is one line of the bounds table.
type boundsRow struct {
	backend, server string
	calls           int
	worst           time.Duration // the longest time past its bound of any call
	ok              bool
	notes           string
}

var (
	boundsMu    sync.Mutex
	boundsTable []boundsRow
)

func printBoundsTable(w io.Writer) {
	boundsMu.Lock()
	defer boundsMu.Unlock()
	if len(boundsTable) == 0 {
		return
	}
	fmt.Fprintf(w, "\ncalls against servers that do not answer, default client options (bound %v each, judged within +%v;\n"+
		"over: the longest any call ran past its bound, negative when all returned before it)\n", boundWait, boundSlack)
	fmt.Fprintf(w, "%-10s %-8s %5s %8s  %-6s %s\n", "backend", "server", "calls", "over", "result", "notes")
	for _, x := range boundsTable {
		res := "ok"
		if !x.ok {
			res = "FAIL"
		}
		fmt.Fprintf(w, "%-10s %-8s %5d %8v  %-6s %s\n", x.backend, x.server, x.calls, x.worst.Round(time.Millisecond), res, x.notes)
	}
}

// boundsCall is one Guard call with its bound.
type boundsCall struct {
	name string
	call func(g *guard.Guard) error
}

func boundsCalls() []boundsCall {
	withDeadline := func(f func(ctx context.Context, g *guard.Guard) error) func(g *guard.Guard) error {
		return func(g *guard.Guard) error {
			ctx, cancel := context.WithTimeout(context.Background(), boundWait)
			defer cancel()
			return f(ctx, g)
		}
	}
	return []boundsCall{
		{"WaitAtMost", func(g *guard.Guard) error {
			_, err := g.Lock(context.Background(), lockKey, guard.WaitAtMost(boundWait))
			return err
		}},
		{"NoWait", func(g *guard.Guard) error {
			_, err := g.Lock(context.Background(), lockKey, guard.NoWait())
			return err
		}},
		{"Lock-ctx", withDeadline(func(ctx context.Context, g *guard.Guard) error {
			_, err := g.Lock(ctx, lockKey)
			return err
		})},
		{"TryLock-ctx", withDeadline(func(ctx context.Context, g *guard.Guard) error {
			_, err := g.TryLock(ctx, lockKey)
			return err
		})},
		{"Do-ctx", withDeadline(func(ctx context.Context, g *guard.Guard) error {
			return g.Do(ctx, lockKey, func(context.Context, *guard.Lock) error { return nil })
		})},
		{"Ping-ctx", withDeadline(func(ctx context.Context, g *guard.Guard) error { return g.Ping(ctx) })},
		{"Inspect-ctx", withDeadline(func(ctx context.Context, g *guard.Guard) error {
			_, err := g.Inspect(ctx, lockKey)
			return err
		})},
	}
}

// defaultLocker builds kind's Locker on addrs with its client library's
// default options, and what closes it.
func defaultLocker(kind string, addrs []string) (driver.Locker, func(), error) {
	switch kind {
	case "redis":
		c := goredis.NewClient(&goredis.Options{Addr: addrs[0]})
		l, err := redislock.New(c)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return l, func() { l.Close(); c.Close() }, nil
	case "redlock":
		var nodes []goredis.UniversalClient
		for _, a := range addrs {
			nodes = append(nodes, goredis.NewClient(&goredis.Options{Addr: a}))
		}
		closeAll := func() {
			for _, n := range nodes {
				n.Close()
			}
		}
		l, err := redlock.New(nodes)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		return l, closeAll, nil
	case "etcd":
		c, err := clientv3.New(clientv3.Config{Endpoints: addrs, Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, err
		}
		l, err := etcdlock.New(c)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return l, func() { l.Close(); c.Close() }, nil
	case "zk":
		l, err := zklock.New(addrs, zklock.WithLogger(discardZK{}))
		if err != nil {
			return nil, nil, err
		}
		return l, func() { l.Close() }, nil
	case "postgres", "mariadb":
		// Nothing may reach the server before the first Guard call: no
		// version query, no ping.
		d := postgres.Open("postgres://warden:warden@" + addrs[0] + "/warden?sslmode=disable")
		if kind == "mariadb" {
			d = mysql.New(mysql.Config{DSN: "warden:warden@tcp(" + addrs[0] + ")/warden?parseTime=true", SkipInitializeWithVersion: true})
		}
		// No ping at Open: the server is not meant to answer.
		db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard, DisableAutomaticPing: true})
		if err != nil {
			return nil, nil, err
		}
		pool, _ := db.DB()
		l, err := sqllock.New(db)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return l, func() { l.Close(); pool.Close() }, nil
	case "consul":
		// api.DefaultConfig's transport has no timeouts; consullock's
		// default request timeout is 5 s, longer than every bound here,
		// so the bounds come from the calls' own contexts.
		c, err := consulClient(addrs[0])
		if err != nil {
			return nil, nil, err
		}
		l, err := consullock.New(c)
		if err != nil {
			return nil, nil, err
		}
		return l, func() { l.Close() }, nil
	}
	return nil, nil, fmt.Errorf("unknown backend %q", kind)
}

// boundsBackends are the backends with a server, and their shared servers'
// addresses, which a hanging proxy stands in front of.
func boundsBackends(t *testing.T) map[string][]string {
	hostOf := func(dsn string) string {
		spec := backendSpec{Kind: "postgres", DSN: dsn}
		if strings.Contains(dsn, "tcp(") {
			spec.Kind = "mariadb"
		}
		return spec.endpoints()[0]
	}
	return map[string][]string{
		"redis":    sharedAddrs(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379"),
		"redlock":  sharedAddrs(t, "WARDEN_REDLOCK_ADDRS", "127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384"),
		"etcd":     sharedAddrs(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379"),
		"zk":       sharedAddrs(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181"),
		"postgres": {hostOf(envOr("WARDEN_POSTGRES_DSN", "postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable"))},
		"mariadb":  {hostOf(envOr("WARDEN_MYSQL_DSN", "warden:warden@tcp(127.0.0.1:13306)/warden?parseTime=true"))},
		"consul":   sharedAddrs(t, "WARDEN_CONSUL_ADDR", "127.0.0.1:18500"),
	}
}

// TestBounds runs every call of boundsCalls at once against each backend's
// server closed (a port nobody listens on) and hanging (a proxy that
// accepts and drops every byte), and judges each row.
func TestBounds(t *testing.T) {
	backends := boundsBackends(t)
	for _, kind := range []string{"redis", "redlock", "etcd", "zk", "postgres", "mariadb", "consul"} {
		for _, server := range []string{"closed", "hanging"} {
			t.Run(kind+"/"+server, func(t *testing.T) {
				t.Parallel()
				var addrs []string
				for _, a := range backends[kind] {
					if server == "closed" {
						addrs = append(addrs, drivertest.ClosedAddr(t))
					} else {
						p := drivertest.StartProxy(t, a)
						p.Blackhole()
						addrs = append(addrs, p.Addr())
					}
				}
				judgeBounds(t, kind, server, addrs)
			})
		}
	}
}

func judgeBounds(t *testing.T, kind, server string, addrs []string) {
	x := boundsRow{backend: kind, server: server, ok: true, worst: -boundWait}
	defer func() {
		boundsMu.Lock()
		boundsTable = append(boundsTable, x)
		boundsMu.Unlock()
	}()
	var notes []string
	fail := func(format string, args ...any) {
		x.ok = false
		msg := fmt.Sprintf(format, args...)
		notes = append(notes, msg)
		t.Error(msg)
	}
	defer func() { x.notes = strings.Join(notes, "; ") }()

	l, closeLocker, err := defaultLocker(kind, addrs)
	if err != nil {
		fail("New: %v", err)
		return
	}
	// Closing may wait for the client's own timeouts: not a Guard call.
	defer func() { go closeLocker() }()
	g, err := guard.New(l, guard.WithCallTimeout(boundWait), guard.WithPrefix(fmt.Sprintf("wb-%s:", runID)))
	if err != nil {
		fail("guard.New: %v", err)
		return
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range boundsCalls() {
		wg.Go(func() {
			start := time.Now()
			err := c.call(g)
			over := time.Since(start) - boundWait
			mu.Lock()
			defer mu.Unlock()
			x.calls++
			x.worst = max(x.worst, over)
			t.Logf("%s: %v past the bound: %v", c.name, over.Round(time.Millisecond), err)
			switch {
			case over > boundSlack:
				fail("%s returned %v past its %v bound", c.name, over.Round(time.Millisecond), boundWait)
			case errors.Is(err, guard.ErrUnsupported):
				// Not offered by the backend (RedLock has no Inspect).
				x.calls--
			case errors.Is(err, guard.ErrNotAcquired):
				fail("%s: an outage reported as contention: %v", c.name, err)
			case !errors.Is(err, guard.ErrUnavailable):
				fail("%s: %v, want an error matching ErrUnavailable", c.name, err)
			}
		})
	}
	wg.Wait()
}

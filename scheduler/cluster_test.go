package scheduler_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// cluster is a shared lock backend and slot store that several schedulers,
// each with a client of its own, run on.
type cluster struct {
	// node returns a Guard on a client of its own, as a separate process
	// would have, closed when t ends.
	node func(t *testing.T, opts ...guard.Option) *guard.Guard
	// store is the shared slot store. Every case has one: without it, once
	// per slot would rest on LockAtLeastFor outlasting timer jitter, which
	// no test on a busy machine can promise.
	store idempotency.Store
	// ttl is a short lock TTL the backend takes (etcd's minimum): the
	// tests that wait for a lease to expire or be checked use it.
	ttl time.Duration
	// lockSpec and storeSpec tell a scheduler process where the lock
	// backend and the slot store are (see specLocker and specStore); empty
	// for memory, which no other process can reach.
	lockSpec, storeSpec string
	// steal takes the lock named name (as the job passed it to guard, whose
	// default prefix the backend sees) away from its holder behind its
	// back, as an operator or a lost lease would; nil for memory and etcd
	// (see TestLockLossCancelsTheJob).
	steal func(t *testing.T, name string)
}

type backend struct {
	name  string
	setup func(t *testing.T) cluster
}

const (
	redisEnv, redisDef = "WARDEN_REDIS_ADDR", "127.0.0.1:16379"
	etcdEnv, etcdDef   = "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379"
	zkEnv, zkDef       = "WARDEN_ZK_SERVERS", "127.0.0.1:12181"
)

func backends() []backend {
	return []backend{
		{name: "memory", setup: func(t *testing.T) cluster {
			locker := memory.New()
			return cluster{node: func(t *testing.T, opts ...guard.Option) *guard.Guard { return newGuard(t, locker, opts...) },
				store: idempotency.NewMemoryStore(), ttl: 600 * time.Millisecond}
		}},
		{name: "sqlite", setup: func(t *testing.T) cluster {
			return sqlCluster(t, "sqlite", sqliteDSN(t))
		}},
		{name: "postgres", setup: func(t *testing.T) cluster {
			return sqlCluster(t, "postgres", reachableDSN(t, "WARDEN_POSTGRES_DSN",
				"postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable", postgres.Open))
		}},
		{name: "mysql", setup: func(t *testing.T) cluster {
			return sqlCluster(t, "mysql", reachableDSN(t, "WARDEN_MYSQL_DSN",
				"warden:warden@tcp(127.0.0.1:13306)/warden?parseTime=true", mysql.Open))
		}},
		{name: "redis", setup: func(t *testing.T) cluster {
			spec := "redis|" + drivertest.Addr(t, redisEnv, redisDef)
			thief := redisClient(t, spec)
			return cluster{
				node: func(t *testing.T, opts ...guard.Option) *guard.Guard {
					return newGuard(t, specLocker(t, spec), opts...)
				},
				store:    specStore(t, spec),
				ttl:      600 * time.Millisecond,
				lockSpec: spec, storeSpec: spec,
				steal: func(t *testing.T, name string) {
					// The layout of backends/redislock/doc.go, under
					// guard's default prefix.
					key := "{warden:" + name + "}:lock"
					if n, err := thief.Del(context.Background(), key).Result(); err != nil || n != 1 {
						t.Fatalf("DEL %s: %d keys, %v", key, n, err)
					}
				},
			}
		}},
		{name: "etcd", setup: func(t *testing.T) cluster {
			c := etcdCluster(t)
			c.storeSpec = c.lockSpec
			c.store = specStore(t, c.storeSpec)
			return c
		}},
		{name: "zk", setup: func(t *testing.T) cluster {
			// Locks and slots both on ZooKeeper: no second system.
			spec := "zk|" + drivertest.Addr(t, zkEnv, zkDef)
			return cluster{
				node: func(t *testing.T, opts ...guard.Option) *guard.Guard {
					// The session timeout bounds the TTL (zklock's Limits).
					return newGuard(t, specLocker(t, spec), append([]guard.Option{guard.WithTTL(zkSession)}, opts...)...)
				},
				store:    specStore(t, spec),
				ttl:      zkSession,
				lockSpec: spec, storeSpec: spec,
			}
		}},
	}
}

// zkSession is the ZooKeeper session timeout of the tests, and so their
// lock TTL.
const zkSession = 2 * time.Second

func etcdCluster(t *testing.T) cluster {
	spec := "etcd|" + drivertest.Addr(t, etcdEnv, etcdDef)
	return cluster{
		node: func(t *testing.T, opts ...guard.Option) *guard.Guard {
			return newGuard(t, specLocker(t, spec), opts...)
		},
		ttl:      etcdlock.MinTTL,
		lockSpec: spec,
	}
}

// eachBackend runs scenario on every backend keep accepts, each in its own
// subtest, all at once. The subtests are not t.Parallel: go test runs at
// most GOMAXPROCS parallel tests at a time, which on a two-core machine
// would run these scenarios, ten seconds each and mostly waiting on timers,
// two at a time. t.Run may be called from several goroutines.
func eachBackend(t *testing.T, keep func(backend) bool, scenario func(t *testing.T, b backend)) {
	var wg sync.WaitGroup
	for _, b := range backends() {
		if keep != nil && !keep(b) {
			continue
		}
		wg.Go(func() { t.Run(b.name, func(t *testing.T) { scenario(t, b) }) })
	}
	wg.Wait()
}

var dialects = map[string]func(string) gorm.Dialector{"sqlite": sqlite.Open, "postgres": postgres.Open, "mysql": mysql.Open}

// specLocker returns a new client of the lock backend spec names
// ("kind|address"), closed when t ends.
func specLocker(t *testing.T, spec string) driver.Locker {
	t.Helper()
	kind, addr, _ := strings.Cut(spec, "|")
	switch kind {
	case "redis":
		locker, err := redislock.New(redisClient(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { locker.Close() })
		return locker
	case "etcd":
		locker, err := etcdlock.New(etcdClient(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { locker.Close() })
		return locker
	case "zk":
		locker, err := zklock.New(strings.Split(addr, ","), zklock.WithSessionTimeout(zkSession), zklock.WithLogger(quietZK{}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { locker.Close() })
		return locker
	}
	open, ok := dialects[kind]
	if !ok {
		t.Fatalf("unknown lock backend %q", spec)
	}
	l, err := sqllock.New(openDB(t, open, addr))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// specStore returns a new client of the slot store spec names, whose
// tables (SQL) the caller has migrated.
func specStore(t *testing.T, spec string) idempotency.Store {
	t.Helper()
	kind, addr, _ := strings.Cut(spec, "|")
	switch kind {
	case "redis":
		s, err := redislock.NewStore(redisClient(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		return s
	case "etcd":
		s, err := etcdlock.NewStore(etcdClient(t, spec))
		if err != nil {
			t.Fatal(err)
		}
		return s
	case "zk":
		conn, _, err := zk.Connect(strings.Split(addr, ","), zkSession, zk.WithLogger(quietZK{}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		s, err := zklock.NewStore(conn)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	open, ok := dialects[kind]
	if !ok {
		t.Fatalf("unknown slot store %q", spec)
	}
	s, err := sqllock.NewStore(openDB(t, open, addr))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// quietZK drops the ZooKeeper client's connection log.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

func redisClient(t *testing.T, spec string) *goredis.Client {
	_, addr, _ := strings.Cut(spec, "|")
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func etcdClient(t *testing.T, spec string) *clientv3.Client {
	t.Helper()
	_, eps, _ := strings.Cut(spec, "|")
	c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(eps, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newGuard(t *testing.T, l driver.Locker, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g, err := guard.New(l, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// sqliteDSN names a database file private to t, opened with WAL and a busy
// timeout so that several connections and processes share it.
func sqliteDSN(t *testing.T) string {
	return filepath.Join(t.TempDir(), "locks.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"
}

func reachableDSN(t *testing.T, env, def string, open func(string) gorm.Dialector) string {
	t.Helper()
	dsn := envOr(env, def)
	db, err := gorm.Open(open(dsn), &gorm.Config{Logger: logger.Discard})
	if err == nil {
		pool, _ := db.DB()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = pool.PingContext(ctx)
		cancel()
		pool.Close()
	}
	if err != nil {
		drivertest.Unreachable(t, env, dsn, err)
	}
	return dsn
}

func openDB(t *testing.T, open func(string) gorm.Dialector, dsn string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return db
}

// sqlStore migrates the idempotency table at dsn and returns a store on it.
func sqlStore(t *testing.T, kind, dsn string) idempotency.Store {
	t.Helper()
	s, err := sqllock.NewStore(openDB(t, dialects[kind], dsn))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func sqlCluster(t *testing.T, kind, dsn string) cluster {
	open := dialects[kind]
	spec := kind + "|" + dsn
	l, err := sqllock.New(openDB(t, open, dsn))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	thief := openDB(t, open, dsn)
	return cluster{
		node: func(t *testing.T, opts ...guard.Option) *guard.Guard {
			return newGuard(t, specLocker(t, spec), opts...)
		},
		store:    sqlStore(t, kind, dsn),
		ttl:      600 * time.Millisecond,
		lockSpec: spec, storeSpec: spec,
		steal: func(t *testing.T, name string) {
			res := thief.Exec("UPDATE warden_locks SET owner = 'thief', version = version + 1 WHERE name = ?", "warden:"+name)
			if res.Error != nil || res.RowsAffected != 1 {
				t.Fatalf("steal %s: %d rows, %v", name, res.RowsAffected, res.Error)
			}
		},
	}
}

// uniqueName keeps tests sharing a server out of each other's locks.
func uniqueName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// waitFor polls cond until it holds, failing t after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

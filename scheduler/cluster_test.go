package scheduler_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/backendtest"
	"github.com/warden-go/warden/backends/etcd"
	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/backends/redis"
	sqllock "github.com/warden-go/warden/backends/sql"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
)

// cluster is a shared lock backend (and slot store, where the backend has
// one) that several schedulers, each with a client of its own, run on.
type cluster struct {
	// node returns a Guard on a client of its own, as a separate process
	// would have, closed when t ends.
	node func(t *testing.T, opts ...guard.Option) *guard.Guard
	// store is the shared slot store, nil where the backend has none yet
	// (etcd).
	store idempotency.Store
}

type backend struct {
	name  string
	setup func(t *testing.T) cluster
}

func backends() []backend {
	return []backend{
		{"memory", func(t *testing.T) cluster {
			locker, store := memory.New(), idempotency.NewMemoryStore()
			return cluster{node: func(t *testing.T, opts ...guard.Option) *guard.Guard { return newGuard(t, locker, opts...) }, store: store}
		}},
		{"sqlite", func(t *testing.T) cluster {
			return sqlCluster(t, sqlite.Open, sqliteDSN(t))
		}},
		{"postgres", func(t *testing.T) cluster {
			return sqlCluster(t, postgres.Open, reachableDSN(t, "WARDEN_POSTGRES_DSN",
				"postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable", postgres.Open))
		}},
		{"mysql", func(t *testing.T) cluster {
			return sqlCluster(t, mysql.Open, reachableDSN(t, "WARDEN_MYSQL_DSN",
				"warden:warden@tcp(127.0.0.1:13306)/warden?parseTime=true", mysql.Open))
		}},
		{"redis", func(t *testing.T) cluster {
			addr := backendtest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
			shared := goredis.NewClient(&goredis.Options{Addr: addr})
			t.Cleanup(func() { shared.Close() })
			return cluster{node: func(t *testing.T, opts ...guard.Option) *guard.Guard {
				client := goredis.NewClient(&goredis.Options{Addr: addr})
				t.Cleanup(func() { client.Close() })
				return newGuard(t, redis.New(client), opts...)
			}, store: redis.NewIdempotencyStore(shared)}
		}},
		{"etcd", func(t *testing.T) cluster {
			eps := backendtest.Addr(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379")
			return cluster{node: func(t *testing.T, opts ...guard.Option) *guard.Guard {
				client, err := clientv3.New(clientv3.Config{Endpoints: []string{eps}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
				if err != nil {
					t.Fatal(err)
				}
				locker, err := etcd.New(client)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					locker.Close(context.Background())
					client.Close()
				})
				return newGuard(t, locker, opts...)
			}}
		}},
	}
}

func newGuard(t *testing.T, l guard.Locker, opts ...guard.Option) *guard.Guard {
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
		backendtest.Unreachable(t, env, dsn, err)
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

func sqlCluster(t *testing.T, open func(string) gorm.Dialector, dsn string) cluster {
	db := openDB(t, open, dsn)
	l, err := sqllock.New(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	store, err := sqllock.NewIdempotencyStore(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return cluster{store: store, node: func(t *testing.T, opts ...guard.Option) *guard.Guard {
		l, err := sqllock.New(openDB(t, open, dsn))
		if err != nil {
			t.Fatal(err)
		}
		return newGuard(t, l, opts...)
	}}
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

package sqllock_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/backendtest"
	sqllock "github.com/warden-go/warden/backends/sql"
	"github.com/warden-go/warden/guard"
)

const (
	postgresEnv = "WARDEN_POSTGRES_DSN"
	mysqlEnv    = "WARDEN_MYSQL_DSN"
	postgresDef = "postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable"
	mysqlDef    = "warden:warden@tcp(127.0.0.1:13306)/warden?parseTime=true"
)

// database is one of the three databases the tests run on. dsn skips or
// fails the test (per WARDEN_REQUIRE_SERVERS) when the server is missing;
// for SQLite it names a file private to the top-level test.
type database struct {
	name     string
	sessions bool
	dsn      func(t testing.TB) string
	open     func(dsn string) gorm.Dialector
}

func databases() []database {
	return []database{
		{
			name: "sqlite",
			dsn: func(t testing.TB) string {
				// WAL lets readers run beside the one writer; busy_timeout
				// makes a writer wait for the file lock instead of failing.
				return filepath.Join(t.TempDir(), "locks.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"
			},
			open: sqlite.Open,
		},
		{
			name:     "postgres",
			sessions: true,
			dsn: func(t testing.TB) string {
				return reachable(t, postgresEnv, env(postgresEnv, postgresDef), postgres.Open)
			},
			open: postgres.Open,
		},
		{
			name:     "mariadb",
			sessions: true,
			dsn: func(t testing.TB) string {
				return reachable(t, mysqlEnv, env(mysqlEnv, mysqlDef), mysql.Open)
			},
			open: mysql.Open,
		},
	}
}

// reachable returns dsn after checking that its server answers; when it does
// not, the test is skipped, or fails under WARDEN_REQUIRE_SERVERS=1.
func reachable(t testing.TB, envName, dsn string, open func(string) gorm.Dialector) string {
	t.Helper()
	g, err := gorm.Open(open(dsn), &gorm.Config{Logger: logger.Discard})
	if err == nil {
		pool, _ := g.DB()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = pool.PingContext(ctx)
		cancel()
		pool.Close()
	}
	if err != nil {
		backendtest.Unreachable(t, envName, dsn, err)
	}
	return dsn
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// openDB opens a client of its own on dsn, as a separate process would have,
// closed when t ends.
func openDB(t testing.TB, db database, dsn string) *gorm.DB {
	t.Helper()
	g, err := gorm.Open(db.open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("open %s: %v", db.name, err)
	}
	pool, err := g.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return g
}

func newLocker(t testing.TB, g *gorm.DB, opts ...sqllock.Option) *sqllock.Locker {
	t.Helper()
	l, err := sqllock.New(g, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// Registered after openDB's cleanup, so it runs first: the listener
	// ends before its pool closes.
	t.Cleanup(func() { l.Close() })
	return l
}

// migrated opens dsn, migrates the tables for opts, and returns the client.
func migrated(t testing.TB, db database, dsn string, opts ...sqllock.Option) *gorm.DB {
	t.Helper()
	g := openDB(t, db, dsn)
	if err := newLocker(t, g, opts...).Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return g
}

// sessionTable keeps session-mode tests off the lease-mode table: the two
// modes must not share one.
const sessionTable = "warden_session_locks"

func TestConformance(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			t.Run("lease", func(t *testing.T) {
				dsn := db.dsn(t)
				migrated(t, db, dsn)
				backendtest.Run(t, backendtest.Backend{
					NewLocker: func(t testing.TB) guard.Locker { return newLocker(t, openDB(t, db, dsn)) },
				})
			})
			t.Run("session", func(t *testing.T) {
				if !db.sessions {
					t.Skipf("%s has no session locks", db.name)
				}
				dsn := db.dsn(t)
				opts := []sqllock.Option{sqllock.WithSessionLocks(), sqllock.WithTable(sessionTable)}
				migrated(t, db, dsn, opts...)
				admin := openDB(t, db, dsn)
				backendtest.Run(t, backendtest.Backend{
					NewLocker: func(t testing.TB) guard.Locker {
						return &recorder{Locker: newLocker(t, openDB(t, db, dsn), opts...)}
					},
					// A crashed holder's session lock is freed when the
					// database notices the dead connection. The suite wants
					// that to take about a TTL, as a lease would; here the
					// database is told after the TTL, by killing the
					// holder's sessions.
					Abandon: func(t testing.TB, l guard.Locker) {
						r := l.(*recorder)
						time.AfterFunc(500*time.Millisecond, func() { r.kill(t, admin) })
					},
				})
			})
		})
	}
}

// recorder remembers the keys its Locker acquired, so that Abandon can find
// the sessions holding them.
type recorder struct {
	*sqllock.Locker
	mu   sync.Mutex
	keys []string
}

func (r *recorder) Acquire(ctx context.Context, key string, o guard.AcquireOptions) (guard.Lease, error) {
	lease, err := r.Locker.Acquire(ctx, key, o)
	if err == nil {
		r.mu.Lock()
		r.keys = append(r.keys, key)
		r.mu.Unlock()
	}
	return lease, err
}

func (r *recorder) kill(t testing.TB, admin *gorm.DB) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.keys {
		if err := killSession(admin, sqllock.SessionName(r.Locker, k)); err != nil {
			t.Errorf("kill the session holding %q: %v", k, err)
		}
	}
}

// killSession ends the database session holding the session lock name, as
// the database does when the holding process dies.
func killSession(admin *gorm.DB, name any) error {
	if n, ok := name.(int64); ok {
		return admin.Exec("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"+
			" AND objsubid = 1 AND classid::bigint = ? AND objid::bigint = ?", int64(uint64(n)>>32), int64(uint64(n)&0xffffffff)).Error
	}
	var id *int64
	if err := admin.Raw("SELECT IS_USED_LOCK(?)", name).Row().Scan(&id); err != nil || id == nil {
		return err
	}
	return admin.Exec(fmt.Sprintf("KILL CONNECTION %d", *id)).Error
}

// uniqueKey is a key no other test or earlier run used.
func uniqueKey(t testing.TB) string {
	return fmt.Sprintf("sqltest/%s/%d", t.Name(), time.Now().UnixNano())
}

package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/backends/sqllock/pglisten"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
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
	name string
	dsn  func(t testing.TB) string
	open func(dsn string) gorm.Dialector
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
			name: "postgres",
			dsn: func(t testing.TB) string {
				return reachable(t, postgresEnv, env(postgresEnv, postgresDef), postgres.Open)
			},
			open: postgres.Open,
		},
		{
			name: "mariadb",
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
		drivertest.Unreachable(t, envName, dsn, err)
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
	g, _ := openConfig(t, db.open(dsn), &gorm.Config{Logger: logger.Discard})
	return g
}

// openConfig opens d with cfg, and closes its pool when t ends.
func openConfig(t testing.TB, d gorm.Dialector, cfg *gorm.Config) (*gorm.DB, *sql.DB) {
	t.Helper()
	g, err := gorm.Open(d, cfg)
	if err != nil {
		t.Fatalf("open %s: %v", d.Name(), err)
	}
	pool, err := g.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return g, pool
}

// newLocker returns a Locker on g whose waiters, on PostgreSQL, listen for
// releases.
func newLocker(t testing.TB, g *gorm.DB, opts ...sqllock.Option) *sqllock.Locker {
	t.Helper()
	l, err := sqllock.New(g, append([]sqllock.Option{sqllock.WithListener(pglisten.Listener{})}, opts...)...)
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

func TestConformance(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			migrated(t, db, dsn)
			b := drivertest.Backend{
				NewLocker: func(t testing.TB) driver.Locker { return newLocker(t, openDB(t, db, dsn)) },
			}
			if db.name == "postgres" {
				b.Silence = func(t testing.TB) (driver.Locker, func()) {
					via, p := proxied(t, dsn)
					return newLocker(t, openDB(t, db, via)), p.Blackhole
				}
			}
			drivertest.Run(t, b)
		})
	}
}

// uniqueKey is a key no other test or earlier run used.
func uniqueKey(t testing.TB) string {
	return fmt.Sprintf("sqltest/%s/%d", t.Name(), time.Now().UnixNano())
}

// TestRefreshBatch: one statement refreshes every lease still its owner's;
// a lease taken over and one from another Locker get their own errors.
func TestRefreshBatch(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			l := newLocker(t, migrated(t, db, dsn))
			other := newLocker(t, openDB(t, db, dsn))
			ctx := context.Background()
			short := driver.AcquireOptions{TTL: 300 * time.Millisecond}
			var leases []driver.Lease
			for range 3 {
				lease, err := l.Acquire(ctx, uniqueKey(t), short)
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, lease)
			}
			foreign, err := other.Acquire(ctx, uniqueKey(t), short)
			if err != nil {
				t.Fatal(err)
			}
			lostKey := uniqueKey(t)
			lost, err := l.Acquire(ctx, lostKey, short)
			if err != nil {
				t.Fatal(err)
			}
			if err := lost.Release(ctx); err != nil {
				t.Fatal(err)
			}
			taker, err := other.Acquire(ctx, lostKey, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer taker.Release(ctx)
			leases = append(leases, foreign, lost)

			before := time.Now()
			errs := l.RefreshBatch(ctx, leases, time.Minute)
			for i, err := range errs[:3] {
				if err != nil {
					t.Errorf("lease %d: %v", i, err)
				}
				if e := leases[i].Expiry(); e.Before(before.Add(time.Minute - time.Second)) {
					t.Errorf("lease %d: Expiry %v after the batch, want about a minute", i, e.Sub(before))
				}
			}
			if !errors.Is(errs[3], driver.ErrInvalidOption) {
				t.Errorf("foreign lease: %v, want ErrInvalidOption", errs[3])
			}
			if !errors.Is(errs[4], driver.ErrNotHeld) {
				t.Errorf("lease taken over: %v, want ErrNotHeld", errs[4])
			}
			// Past the original 300ms, the refreshed locks still keep
			// others out.
			time.Sleep(600 * time.Millisecond)
			for i, lease := range leases[:3] {
				if err := lease.Release(ctx); err != nil {
					t.Errorf("lease %d after the batch refresh: %v", i, err)
				}
			}
			foreign.Release(ctx)
		})
	}
}

// TestRefreshBatchSomeReleased: leases given out of key order, some of them
// released, are told apart by one statement on PostgreSQL (it answers with
// the leases it did not extend), and by their place in the batch on every
// database.
func TestRefreshBatchSomeReleased(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			g := migrated(t, db, dsn)
			l := newLocker(t, g)
			ctx := context.Background()
			key := uniqueKey(t)
			// Keys in reverse order, so that the batch is sorted anew.
			var leases []driver.Lease
			for i := 5; i >= 0; i-- {
				lease, err := l.Acquire(ctx, fmt.Sprintf("%s/%d", key, i), driver.AcquireOptions{TTL: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, lease)
			}
			released := map[int]bool{0: true, 3: true}
			for i := range released {
				if err := leases[i].Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			var statements atomic.Int64
			count := func(*gorm.DB) { statements.Add(1) }
			for _, err := range []error{
				g.Callback().Raw().After("gorm:raw").Register("count", count),
				g.Callback().Row().After("gorm:row").Register("count", count),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			errs := l.RefreshBatch(ctx, leases, time.Minute)
			for i, err := range errs {
				if released[i] != errors.Is(err, driver.ErrNotHeld) {
					t.Errorf("lease %d (released %v): %v", i, released[i], err)
				}
			}
			if n := statements.Load(); db.name == "postgres" && n != 1 {
				t.Errorf("%d statements, want 1", n)
			}
			for i, lease := range leases {
				if !released[i] {
					if err := lease.Release(ctx); err != nil {
						t.Errorf("lease %d after the batch: %v", i, err)
					}
				}
			}
		})
	}
}

// TestRefreshBatchOwners: a batch renewal extends exactly the rows of its
// leases whose owner values it names, whether the value begins with the
// Locker's id (sent once per statement on PostgreSQL) or is hashed, since
// the id leaves no room for the label (the whole value sent), both in one
// batch, with quotes and backslashes in the id, labels and keys, and keys
// whose bytes in common end inside a character (é and è).
func TestRefreshBatchOwners(t *testing.T) {
	id := strings.Repeat("i", 190) + `"q\`
	labels := []string{"", `a"b\c`, strings.Repeat("x", 63) + `"`} // the last one hashed
	names := []string{"é", "è", `è"\`}
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			g := migrated(t, db, db.dsn(t))
			l := newLocker(t, g, sqllock.WithOwner(id))
			ctx := context.Background()
			key := uniqueKey(t)
			var leases []driver.Lease
			for i, label := range labels {
				lease, err := l.Acquire(ctx, key+"/"+names[i], driver.AcquireOptions{TTL: time.Minute, Owner: label})
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, lease)
			}
			for i, err := range l.RefreshBatch(ctx, leases, time.Minute) {
				if err != nil {
					t.Errorf("lease %d (label %q): %v", i, labels[i], err)
				}
			}
			for i := range leases {
				// Each in turn released, and the batch told so.
				if err := leases[i].Release(ctx); err != nil {
					t.Fatalf("lease %d: %v", i, err)
				}
				for j, err := range l.RefreshBatch(ctx, leases, time.Minute) {
					if j <= i != errors.Is(err, driver.ErrNotHeld) || (j > i && err != nil) {
						t.Errorf("after releasing %d: lease %d (label %q): %v", i, j, labels[j], err)
					}
				}
			}
		})
	}
}

// TestRefreshPlan: PostgreSQL looks a batch renewal's rows up by the
// primary key even in a custom plan, which sees how many leases the batch
// holds (as the first five runs of the statement on each connection do),
// rather than scanning the whole table.
func TestRefreshPlan(t *testing.T) {
	db := postgresDB()
	dsn := db.dsn(t)
	table := fmt.Sprintf("warden_plan_%d", time.Now().UnixNano())
	g := migrated(t, db, dsn, sqllock.WithTable(table))
	t.Cleanup(func() { g.Exec("DROP TABLE " + table) })
	if err := g.Exec("INSERT INTO " + table + " (name, owner, version, lock_until, locked_at)" +
		" SELECT 'plan/' || i, 'owner/' || i, 1, 0, 0 FROM generate_series(1, 100000) AS i").Error; err != nil {
		t.Fatal(err)
	}
	if err := g.Exec("ANALYZE " + table).Error; err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 5000)
	for i := range keys {
		keys[i] = fmt.Sprintf("plan/%d", 10*i+1)
	}
	query, args := sqllock.RefreshStatement(newLocker(t, g, sqllock.WithTable(table)), keys, time.Minute)
	var plan []string
	err := g.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SET LOCAL plan_cache_mode = force_custom_plan").Error; err != nil {
			return err
		}
		return tx.Raw("EXPLAIN "+query, args...).Scan(&plan).Error
	})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if strings.Contains(text, "Seq Scan on "+table) || !strings.Contains(text, "Index Scan using "+table+"_pkey") {
		t.Errorf("plan of a renewal of 5,000 leases in 100,000 rows:\n%s", text)
	}
}

// Many locks with a 3s ttl, renewed through one Guard while other processes
// load the machine: none is lost. The keeper renews them all in one batch
// per period, which the Locker sends in statements of up to 50,000 leases
// run at once (see RefreshBatch). The counts are what a two-core machine
// busy with other work renews with room to spare while HoldMany loads it
// further: 50,000 on PostgreSQL was lost once to a renewal that missed its
// 1.7 s at a load of 10. MariaDB updates a row at several times
// PostgreSQL's cost, and each of its acquisitions takes two statements.
// (BENCHMARKS.md measures 100,000 on a quiet machine.)
func TestHoldManyUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 25,000 locks")
	}
	for _, c := range []struct {
		db database
		n  int
	}{{postgresDB(), 25_000}, {mariaDB(), 20_000}} {
		t.Run(c.db.name, func(t *testing.T) {
			dsn := c.db.dsn(t)
			g := migrated(t, c.db, dsn)
			drivertest.HoldMany(t, newLocker(t, g), c.n, 3*time.Second, 6*time.Second)
			// Release keeps the rows; delete these, released, rather
			// than leave the shared table a test's worth larger each run.
			now := "(extract(epoch from clock_timestamp())*1000000)::bigint"
			if c.db.name == "mariadb" {
				now = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
			}
			if err := g.Exec("DELETE FROM " + sqllock.DefaultTable + " WHERE name LIKE 'warden:hold-many/%' AND lock_until <= " + now).Error; err != nil {
				t.Errorf("deleting the released rows: %v", err)
			}
		})
	}
}

// A program on SQLite alone does not link the PostgreSQL or MySQL drivers:
// the package depends on neither, and PostgreSQL's listener is in pglisten.
func TestLinksNoDatabaseDriver(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/warden-go/warden/backends/sqllock").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/jackc/pgx") || strings.HasPrefix(dep, "github.com/go-sql-driver/mysql") ||
			strings.HasPrefix(dep, "gorm.io/driver/") {
			t.Errorf("sqllock depends on %s", dep)
		}
	}
}

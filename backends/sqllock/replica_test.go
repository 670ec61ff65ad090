package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"gorm.io/plugin/dbresolver"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// anotherDatabase creates another database on the MariaDB server of dsn,
// dropped when t ends, and returns the names of dsn's database and of the
// new one, and a DSN of the new one.
func anotherDatabase(t *testing.T, primary *gorm.DB, dsn, prefix string) (current, name, nameDSN string) {
	t.Helper()
	if err := primary.Raw("SELECT DATABASE()").Scan(&current).Error; err != nil {
		t.Fatal(err)
	}
	name = fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	if err := primary.Exec("CREATE DATABASE " + name).Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Exec("DROP DATABASE " + name) })
	return current, name, strings.Replace(dsn, "/"+current+"?", "/"+name+"?", 1)
}

// staleReplica returns a client of dsn, a MariaDB DSN, whose reads gorm's
// dbresolver sends to a replica that lags: another database of the same
// server, holding copies of the tables tables that do not change unless
// copy is called, which copies the rows where cond holds as they are now.
func staleReplica(t *testing.T, db database, dsn string, tables ...string) (g *gorm.DB, copyRows func(table, cond string, args ...any)) {
	t.Helper()
	primary := openDB(t, db, dsn)
	current, stale, replica := anotherDatabase(t, primary, dsn, "warden_stale")
	for _, table := range tables {
		if err := primary.Exec("CREATE TABLE " + stale + "." + table + " LIKE " + current + "." + table).Error; err != nil {
			t.Fatal(err)
		}
	}
	g = openDB(t, db, dsn)
	if err := g.Use(dbresolver.Register(dbresolver.Config{Replicas: []gorm.Dialector{mysql.Open(replica)}})); err != nil {
		t.Fatal(err)
	}
	return g, func(table, cond string, args ...any) {
		t.Helper()
		if err := primary.Exec("REPLACE INTO "+stale+"."+table+" SELECT * FROM "+current+"."+table+" WHERE "+cond, args...).Error; err != nil {
			t.Fatal(err)
		}
	}
}

// TestOwnerChecksSkipReplicas: on MariaDB behind gorm's dbresolver, a lease
// force-released and taken by another holder is not renewed by a batch
// renewal, and a claim deleted and claimed again is not extended, whatever
// the lagging replica still shows: MySQL counts the rows an UPDATE changed,
// so when one changed none the owner is checked by a read, which must see
// the primary's rows.
func TestOwnerChecksSkipReplicas(t *testing.T) {
	db := databases()[2]
	dsn := db.dsn(t)
	plain := migrated(t, db, dsn)
	store, err := sqllock.NewStore(plain)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	g, copyRows := staleReplica(t, db, dsn, sqllock.DefaultTable, sqllock.DefaultIdempotencyTable)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("RefreshBatch", func(t *testing.T) {
		l := newLocker(t, g)
		other := newLocker(t, plain)
		k := uniqueKey(t)
		lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		copyRows(sqllock.DefaultTable, "name = ?", k)
		if _, err := other.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if errs := l.RefreshBatch(ctx, []driver.Lease{lease}, time.Minute); !errors.Is(errs[0], driver.ErrNotHeld) {
			t.Fatalf("batch renewal of a lease force-released and taken by another: %v, want ErrNotHeld", errs[0])
		}
	})

	t.Run("Extend", func(t *testing.T) {
		s, err := sqllock.NewStore(g)
		if err != nil {
			t.Fatal(err)
		}
		c := idempotency.Claim{Scope: "s", Key: uniqueKey(t), Fingerprint: "f", Owner: "first", Lease: time.Minute}
		if rec, err := s.Claim(ctx, c); err != nil || rec != nil {
			t.Fatalf("Claim: %v, %v", rec, err)
		}
		copyRows(sqllock.DefaultIdempotencyTable, "1 = 1")
		if err := store.Delete(ctx, c.Scope, c.Key, ""); err != nil {
			t.Fatal(err)
		}
		second := c
		second.Owner = "second"
		if rec, err := store.Claim(ctx, second); err != nil || rec != nil {
			t.Fatalf("Claim by another: %v, %v", rec, err)
		}
		if err := s.Extend(ctx, c.Scope, c.Key, c.Owner, time.Minute); !errors.Is(err, idempotency.ErrNotOwner) {
			t.Fatalf("Extend of a claim deleted and claimed by another: %v, want ErrNotOwner", err)
		}
	})
}

// TestResolverSourcesRefused: New refuses a *gorm.DB whose dbresolver sends
// writes to Sources, another database than the one it was opened on (the
// plugin's own first example). A Locker on it acquired in the database it
// was opened on and renewed in batches, inspected and migrated in the
// other: a batch renewal of a lease just acquired found no lease.
func TestResolverSourcesRefused(t *testing.T) {
	db := databases()[2]
	dsn := db.dsn(t)
	_, _, sources := anotherDatabase(t, migrated(t, db, dsn), dsn, "warden_sources")
	g := openDB(t, db, dsn)
	if err := g.Use(dbresolver.Register(dbresolver.Config{Sources: []gorm.Dialector{mysql.Open(sources)}})); err != nil {
		t.Fatal(err)
	}
	l, err := sqllock.New(g)
	if errors.Is(err, driver.ErrInvalidOption) {
		t.Log(err)
		return
	}
	if err != nil {
		t.Fatalf("New behind a resolver with Sources: %v, want ErrInvalidOption", err)
	}
	ctx := context.Background()
	lease, err := l.Acquire(ctx, uniqueKey(t), driver.AcquireOptions{TTL: time.Minute})
	if err == nil {
		err = l.RefreshBatch(ctx, []driver.Lease{lease}, time.Minute)[0]
		lease.Release(ctx)
	}
	t.Fatalf("New behind a resolver with Sources returned a Locker, want ErrInvalidOption (a batch renewal of a lease just acquired: %v)", err)
}

// TestResolverReplicasPrepared: New accepts a *gorm.DB behind a dbresolver
// with Replicas alone, whose writes stay on its own pool, also when gorm
// prepares statements twice over (PrepareStmt in the Config, and again in a
// Session): each layer wraps the pool once more.
func TestResolverReplicasPrepared(t *testing.T) {
	db := databases()[2]
	dsn := db.dsn(t)
	g, _ := openConfig(t, db.open(dsn), &gorm.Config{Logger: logger.Discard, PrepareStmt: true})
	if err := g.Use(dbresolver.Register(dbresolver.Config{Replicas: []gorm.Dialector{mysql.Open(dsn)}})); err != nil {
		t.Fatal(err)
	}
	for name, g := range map[string]*gorm.DB{"Config": g, "Config and Session": g.Session(&gorm.Session{PrepareStmt: true})} {
		if _, err := sqllock.New(g); err != nil {
			t.Errorf("New behind a resolver with Replicas alone, PrepareStmt in the %s: %v", name, err)
		}
	}
}

// taggedPool is an application's pool: a comparable type, whose value is
// not comparable once the embedded interface holds an uncomparable one.
type taggedPool struct{ gorm.ConnPool }

type poolWithTags struct {
	*sql.DB
	tags []string
}

// TestUncomparablePool: New accepts a *gorm.DB on its own pool of a
// comparable type whose value cannot be compared; the check that gorm sends
// the lock table's statements to that pool compared it, and panicked.
func TestUncomparablePool(t *testing.T) {
	raw, err := sql.Open("sqlite", t.TempDir()+"/warden.db")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	g, err := gorm.Open(&sqlite.Dialector{Conn: taggedPool{poolWithTags{raw, nil}}}, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("New panicked: %v", r)
		}
	}()
	if _, err := sqllock.New(g); err != nil {
		t.Fatalf("New on its own pool: %v", err)
	}
}

package sqllock_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/warden-go/warden/backends/sqllock"
)

// BenchmarkCycleClient is one uncontended lock cycle on PostgreSQL by the
// Locker ("locker"), and the same two statements sent by hand through
// database/sql on the Locker's own pool ("sql"), on the pgx connection
// under each of that pool's connections ("pgx-under-pool", as the Locker
// could reach it through sql.Conn.Raw), and on one pgx connection
// ("pgx"), the release by hand without the Locker's notification CASE,
// which its server side alone costs: the differences in allocations and
// client time are the client's. Client instructions per
// cycle are best counted under callgrind (GOMAXPROCS=1, GOGC=off,
// GODEBUG=asyncpreemptoff=1) by the difference between two -benchtime
// counts: on 2026-11-27 about 42k for the Locker, 42k by hand through
// database/sql and 29k on pgx, the difference being database/sql's and
// pgx's database/sql driver's, which a *gorm.DB's pool goes through. A
// later count (1300 - 300 cycles, another build and load): the Locker
// 46.3k and 39 allocations, database/sql 48.6k and 40, pgx under the pool
// 39.1k and 28, pgx 35.1k and 24. The Locker does not take pgx's own
// connection: it would save some 7k of a cycle's 230k or so, client and
// server, and would make the package link pgx, which programs on MySQL or
// SQLite do not.
func BenchmarkCycleClient(b *testing.B) {
	db := postgresDB()
	dsn := db.dsn(b)
	g := migrated(b, db, dsn)
	l := newLocker(b, g)
	acquire, release := sqllock.CycleStatements(l)
	// Cancellable, as a lock's context is: database/sql and pgx watch
	// such a context during a statement.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ttl := time.Minute.Microseconds()
	b.Run("locker", func(b *testing.B) {
		lockCycles(ctx, b, l, fmt.Sprintf("bench/cycle/%d", time.Now().UnixNano()))
	})
	b.Run("sql", func(b *testing.B) {
		pool, err := g.DB()
		if err != nil {
			b.Fatal(err)
		}
		handCycles(b, func(k, owner string) (version int64, err error) {
			err = pool.QueryRowContext(ctx, acquire, k, owner, ttl).Scan(&version)
			return version, err
		}, func(k, owner string, version int64) (int64, error) {
			res, err := pool.ExecContext(ctx, release, k, owner, version)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		})
	})
	b.Run("pgx-under-pool", func(b *testing.B) {
		pool, err := g.DB()
		if err != nil {
			b.Fatal(err)
		}
		// pgx's own connection under the pool's, for each statement, as
		// the Locker could reach it (sql.Conn.Raw, *stdlib.Conn).
		onPGX := func(f func(*pgx.Conn) error) error {
			c, err := pool.Conn(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			return c.Raw(func(dc any) error { return f(dc.(*stdlib.Conn).Conn()) })
		}
		handCycles(b, func(k, owner string) (version int64, err error) {
			err = onPGX(func(c *pgx.Conn) error { return c.QueryRow(ctx, acquire, k, owner, ttl).Scan(&version) })
			return version, err
		}, func(k, owner string, version int64) (n int64, err error) {
			err = onPGX(func(c *pgx.Conn) error {
				tag, err := c.Exec(ctx, release, k, owner, version)
				n = tag.RowsAffected()
				return err
			})
			return n, err
		})
	})
	b.Run("pgx", func(b *testing.B) {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		handCycles(b, func(k, owner string) (version int64, err error) {
			err = conn.QueryRow(ctx, acquire, k, owner, ttl).Scan(&version)
			return version, err
		}, func(k, owner string, version int64) (int64, error) {
			tag, err := conn.Exec(ctx, release, k, owner, version)
			return tag.RowsAffected(), err
		})
	})
}

// handCycles runs b's lock cycles on a key of its own by acquire and
// release, each attempt with an owner value of its own.
func handCycles(b *testing.B, acquire func(k, owner string) (int64, error), release func(k, owner string, version int64) (int64, error)) {
	k := fmt.Sprintf("bench/cycle/%d", time.Now().UnixNano())
	n := 0
	for b.Loop() {
		n++
		owner := "bench/" + strconv.Itoa(n)
		version, err := acquire(k, owner)
		if err != nil {
			b.Fatal(err)
		}
		if released, err := release(k, owner, version); err != nil || released != 1 {
			b.Fatalf("release: %d rows, %v", released, err)
		}
	}
}

package main

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/backends/sqllock/pglisten"
	"github.com/warden-go/warden/guard"
)

// The benchmark's own tables, so that its rows never mix with an
// application's or a test's.
const (
	wardenTable = "bench_peers_warden_locks"
	rawTable    = "bench_peers_raw_locks"
)

// The raw peer: the lock is a row, taken by one statement when absent or
// expired, released by deleting it if it is still ours. Expiry is counted
// on the database's clock.
const (
	pgAcquire = `INSERT INTO ` + rawTable + ` AS l (name, owner, until)
VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, until = excluded.until
WHERE l.until < clock_timestamp()`
	pgRelease = `DELETE FROM ` + rawTable + ` WHERE name = $1 AND owner = $2`
	pgRenew   = `UPDATE ` + rawTable + ` SET until = clock_timestamp() + $3 * interval '1 millisecond'
WHERE name = $1 AND owner = $2 AND until > clock_timestamp()`
	pgCreate = `CREATE TABLE IF NOT EXISTS ` + rawTable + ` (
	name  text        NOT NULL PRIMARY KEY,
	owner text        NOT NULL,
	until timestamptz NOT NULL
)`
)

func postgresSubjects(b *bench) []*subject {
	dsn := b.srv.postgres
	return []*subject{
		{
			id: "warden-pg", label: "warden sqllock (PostgreSQL)", group: "postgres", warden: true,
			how: "guard.Do over sqllock.New(gorm on pgx, WithListener(pglisten.Listener{})); a waiter polls with backoff up to 250ms and marks the row as waited for, and a release so marked wakes it by a NOTIFY (sent a millisecond after the release when the releaser had waiters lately, and dropped if it took the lock back; a release nobody waits for sends none); the lease keeper renews all held locks with one UPDATE per period",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) { return newWardenPG(dsn, m, workerConns) }), nil
			},
			holder: func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
				w, err := newWardenPG(dsn, m, holderConns, guard.WithTTL(ttl))
				if err != nil {
					return nil, err
				}
				return newGuardHolder(ctx, w, b.keyFor("warm-up", "holder", 0, 0, 0))
			},
		},
		rawPGSubject(dsn, false), rawPGSubject(dsn, true),
	}
}

func rawPGSubject(dsn string, tuned bool) *subject {
	s := &subject{
		id: "raw-pg", label: "raw INSERT … ON CONFLICT (pgx)", group: "postgres",
		fixture: func(ctx context.Context, m *meter) (fixture, error) {
			return perWorker(func(ctx context.Context) (worker, error) { return newRawPGWorker(ctx, dsn, m, tuned) }), nil
		},
	}
	if !tuned {
		s.holder = func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
			return newRawPGHolder(ctx, dsn, m, ttl)
		}
	}
	return variant(s, tuned,
		"hand-written on pgx "+modVersion("github.com/jackc/pgx/v5")+", one connection per worker: INSERT … ON CONFLICT (name) DO UPDATE … WHERE expired, retried after a jittered pause growing from 1ms to 32ms; release: DELETE … WHERE owner; renewal: a goroutine per lock running an owner-checked UPDATE every TTL/3 on a pool of 8 connections",
		"as raw INSERT … ON CONFLICT, retried every 1ms")
}

// pgTracer counts the statements a pgx connection sends.
type pgTracer struct{ m *meter }

func (t pgTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.m.sent("statement")
	return ctx
}

func (pgTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func pgConfig(dsn string, m *meter) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if m != nil {
		cfg.Tracer = pgTracer{m}
	}
	return cfg, nil
}

// preparePostgres checks the server answers, creates the benchmark's
// tables, and returns its version.
func preparePostgres(ctx context.Context, dsn string) (string, error) {
	cfg, err := pgConfig(dsn, nil)
	if err != nil {
		return "", err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", fmt.Errorf("postgres: %w", err)
	}
	defer conn.Close(ctx)
	var version string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, pgCreate); err != nil {
		return "", err
	}
	db, err := openGorm(dsn, nil, workerConns)
	if err != nil {
		return "", err
	}
	defer closeGorm(db)
	locker, err := sqllock.New(db, sqllock.WithTable(wardenTable))
	if err != nil {
		return "", err
	}
	defer locker.Close()
	if err := locker.Migrate(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("PostgreSQL %s (%s)", version, hostOf(dsn)), nil
}

func hostOf(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Host != "" {
		return u.Host
	}
	return "?"
}

// Connection pools of warden's PostgreSQL subjects. A worker's has room for
// the listener's connection beside the statements': a pool of one would
// make sqllock leave its waiters to poll. The renewal scenario's holder
// takes its locks 16 at a time, and its pool has room for those, the
// keeper's renewals and the listener, as gorm's default pool (unbounded)
// would: with 4, the keeper's renewals would queue behind 16 acquisitions
// or releases for one of 3 connections.
const (
	workerConns = 4
	holderConns = 16 + 2
)

// openGorm opens gorm on pgx's database/sql driver with the counting
// tracer, the way gorm.io/driver/postgres does by default, with a pool of
// conns connections.
func openGorm(dsn string, m *meter, conns int) (*gorm.DB, error) {
	cfg, err := pgConfig(dsn, m)
	if err != nil {
		return nil, err
	}
	sqlDB := stdlib.OpenDB(*cfg)
	sqlDB.SetMaxOpenConns(conns)
	sqlDB.SetMaxIdleConns(conns)
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		sqlDB.Close()
		return nil, err
	}
	return db, nil
}

func closeGorm(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.Close()
	}
}

func newWardenPG(dsn string, m *meter, conns int, opts ...guard.Option) (*guardWorker, error) {
	w := &guardWorker{}
	db, err := openGorm(dsn, m, conns)
	if err != nil {
		return nil, err
	}
	w.cl.add(func() { closeGorm(db) })
	locker, err := sqllock.New(db, sqllock.WithTable(wardenTable), sqllock.WithListener(pglisten.Listener{}))
	return w.guardOn(locker, err, opts...)
}

// rawPGWorker is the single-statement lock on one pgx connection.
type rawPGWorker struct {
	conn   *pgx.Conn
	linear bool
}

func newRawPGWorker(ctx context.Context, dsn string, m *meter, linear bool) (worker, error) {
	cfg, err := pgConfig(dsn, m)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &rawPGWorker{conn: conn, linear: linear}, nil
}

func (w *rawPGWorker) cycle(ctx context.Context, key string, section func()) error {
	owner := randomOwner()
	bo := backoff{linear: w.linear}
	for {
		tag, err := w.conn.Exec(ctx, pgAcquire, key, owner, workerTTL.Milliseconds())
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			break
		}
		if err := bo.wait(ctx); err != nil {
			return err
		}
	}
	section()
	rctx, cancel := releaseContext()
	defer cancel()
	tag, err := w.conn.Exec(rctx, pgRelease, key, owner)
	if err == nil && tag.RowsAffected() != 1 {
		err = errNotHeld
	}
	return err
}

func (w *rawPGWorker) close() {
	ctx, cancel := releaseContext()
	defer cancel()
	w.conn.Close(ctx)
}

// rawPGHolder renews each lock from a goroutine of its own, one statement
// per lock per period.
type rawPGHolder struct {
	pool   *pgxpool.Pool
	ttl    time.Duration
	r      *renewers
	keys   []string
	owners []string
}

func newRawPGHolder(ctx context.Context, dsn string, m *meter, ttl time.Duration) (holder, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = pgTracer{m}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return &rawPGHolder{pool: pool, ttl: ttl, r: newRenewers()}, nil
}

func (h *rawPGHolder) hold(ctx context.Context, keys []string) error {
	h.keys = keys
	h.owners = make([]string, len(keys))
	h.r.track(len(keys))
	ms := h.ttl.Milliseconds()
	return parallel(ctx, len(keys), 8, func(ctx context.Context, i int) error {
		owner := randomOwner()
		h.owners[i] = owner
		tag, err := h.pool.Exec(ctx, pgAcquire, keys[i], owner, ms)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%s: taken", keys[i])
		}
		key := keys[i]
		h.r.start(i, h.ttl/3, h.ttl, func(ctx context.Context) error {
			tag, err := h.pool.Exec(ctx, pgRenew, key, owner, ms)
			if err == nil && tag.RowsAffected() != 1 {
				err = errNotHeld
			}
			return err
		})
		return nil
	})
}

func (h *rawPGHolder) lost() int { return h.r.lost() }

func (h *rawPGHolder) release(ctx context.Context) error {
	defer h.r.halt() // see renewers.halt
	return parallel(ctx, len(h.keys), 8, func(ctx context.Context, i int) error {
		if h.owners[i] == "" || h.r.releasing(i) {
			return nil
		}
		tag, err := h.pool.Exec(ctx, pgRelease, h.keys[i], h.owners[i])
		if err == nil {
			h.r.released(i, tag.RowsAffected() == 1)
		}
		return err
	})
}

func (h *rawPGHolder) close() { h.r.halt(); h.pool.Close() }

// cleanPostgres deletes this run's rows: sqllock keeps a released lock's
// row for its fencing counter.
func cleanPostgres(ctx context.Context, dsn, prefix string) {
	cfg, err := pgConfig(dsn, nil)
	if err != nil {
		return
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	like := "%" + prefix + "%"
	conn.Exec(ctx, `DELETE FROM `+wardenTable+` WHERE name LIKE $1`, like)
	conn.Exec(ctx, `DELETE FROM `+rawTable+` WHERE name LIKE $1`, like)
}

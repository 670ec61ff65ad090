package sqllock_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
)

// faults makes the connections of faultyConnector fail as told.
type faults struct {
	refuse    atomic.Bool  // the next QueryContext fails with ErrBadConn, sending nothing
	breakRows atomic.Bool  // rows fail with ErrBadConn after the statement ran
	sent      atomic.Int32 // statements QueryContext sent
}

// faultyConnector connects with pgx's driver, wrapping each connection.
type faultyConnector struct {
	sqldriver.Connector
	f *faults
}

func (c faultyConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return faultyConn{conn, c.f}, nil
}

type faultyConn struct {
	sqldriver.Conn
	f *faults
}

func (c faultyConn) QueryContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if c.f.refuse.CompareAndSwap(true, false) {
		return nil, sqldriver.ErrBadConn
	}
	c.f.sent.Add(1)
	rows, err := c.Conn.(sqldriver.QueryerContext).QueryContext(ctx, query, args)
	if err == nil && c.f.breakRows.Load() {
		return brokenRows{rows}, nil
	}
	return rows, err
}

// brokenRows reads the statement's row, then reports the connection broken,
// as lib/pq does when the connection ends while reading.
type brokenRows struct{ sqldriver.Rows }

func (r brokenRows) Next(dest []sqldriver.Value) error {
	if err := r.Rows.Next(dest); err != nil {
		return err
	}
	return sqldriver.ErrBadConn
}

// TestQueryRowRetriesOnlyUnsent: on PostgreSQL, a row-returning statement
// whose connection is found broken before it is sent goes on another
// connection, and one whose connection breaks after it ran is not sent
// again: each INSERT lands exactly once.
func TestQueryRowRetriesOnlyUnsent(t *testing.T) {
	db := postgresDB()
	cfg, err := pgx.ParseConfig(db.dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	f := &faults{}
	pool := sql.OpenDB(faultyConnector{stdlib.GetConnector(*cfg), f})
	t.Cleanup(func() { pool.Close() })
	g, err := gorm.Open(postgres.New(postgres.Config{Conn: pool}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	l, err := sqllock.New(g, sqllock.WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	table := fmt.Sprintf("warden_test_sent_%d", time.Now().UnixNano())
	if err := g.Exec("CREATE TABLE " + table + " (n bigint NOT NULL)").Error; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Exec("DROP TABLE IF EXISTS " + table) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	insert := "INSERT INTO " + table + " (n) VALUES ($1) RETURNING n"
	landed := func(n int64) int64 {
		t.Helper()
		var count int64
		if err := g.Raw("SELECT count(*) FROM "+table+" WHERE n = ?", n).Scan(&count).Error; err != nil {
			t.Fatal(err)
		}
		return count
	}

	f.refuse.Store(true)
	var got sql.NullInt64
	err = sqllock.QueryRow(ctx, l, insert, []any{int64(1)}, &got)
	sent := f.sent.Load()
	if err != nil || got.Int64 != 1 {
		t.Errorf("refused before sending: (%v, %v), want the row 1 from another connection", got, err)
	}
	if n := landed(1); n != 1 || sent != 1 {
		t.Errorf("refused before sending: %d rows, %d statements sent, want 1 and 1", n, sent)
	}

	f.sent.Store(0)
	f.breakRows.Store(true)
	err = sqllock.QueryRow(ctx, l, insert, []any{int64(2)}, &got)
	f.breakRows.Store(false)
	sent = f.sent.Load()
	if !errors.Is(err, sqldriver.ErrBadConn) {
		t.Errorf("broken after sending: %v, want ErrBadConn", err)
	}
	if n := landed(2); n != 1 || sent != 1 {
		t.Errorf("broken after sending: %d rows, %d statements sent, want 1 and 1 (not run again)", n, sent)
	}
}

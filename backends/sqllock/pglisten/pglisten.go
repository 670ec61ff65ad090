// Package pglisten lets the sqllock backend's waiters on PostgreSQL hear a
// release the moment it commits, through pgx, the driver of
// gorm.io/driver/postgres:
//
//	locker, err := sqllock.New(db, sqllock.WithListener(pglisten.Listener{}))
//
// It is a package of its own so that programs on MySQL or SQLite do not link
// pgx.
package pglisten

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/warden-go/warden/backends/sqllock"
)

// Listener is a sqllock.Listener on pgx's database/sql driver.
type Listener struct{}

var _ sqllock.Listener = Listener{}

// Listen implements sqllock.Listener.
func (Listener) Listen(ctx context.Context, conn *sql.Conn, channel string, listening func(), note func(payload string)) error {
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w: %T is not pgx's", sqllock.ErrCannotListen, dc)
		}
		c := sc.Conn()
		if _, err := c.PgConn().Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()).ReadAll(); err != nil {
			return err
		}
		listening()
		for {
			n, err := c.WaitForNotification(ctx)
			if err != nil {
				return err
			}
			if n.Channel == channel {
				note(n.Payload)
			}
		}
	})
}

package sqllock

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
)

var _ driver.Pinger = (*Locker)(nil)

// Ping implements driver.Pinger.
func (l *Locker) Ping(ctx context.Context) error { return ping(ctx, l.db) }

// Ping reports whether the store's database answers, as Locker.Ping does.
func (s *Store) Ping(ctx context.Context) error { return ping(ctx, s.db) }

func ping(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return fmt.Errorf("%w: sql: %w", driver.ErrUnavailable, err)
	}
	// database/sql's drivers honour ctx here, but a dial to an address that
	// drops packets may not: the answer is not waited for past ctx.
	answer := make(chan error, 1)
	go func() { answer <- sqlDB.PingContext(ctx) }()
	select {
	case err := <-answer:
		if err != nil {
			return unavailable(ctx, fmt.Errorf("sql: %w", err))
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

package redislock

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

var _ driver.Pinger = (*Locker)(nil)

// Ping implements driver.Pinger.
func (l *Locker) Ping(ctx context.Context) error { return ping(ctx, l.client) }

// Ping reports whether the store's Redis answers, as Locker.Ping does.
func (s *Store) Ping(ctx context.Context) error { return ping(ctx, s.client) }

// ping sends PING, returning when ctx ends even if the client does not:
// go-redis applies ctx deadlines to its connections only with
// ContextTimeoutEnabled, and a health check must not hang for its read
// timeout on a server that stopped answering.
func ping(ctx context.Context, c goredis.UniversalClient) error {
	answer := make(chan error, 1)
	go func() { answer <- c.Ping(ctx).Err() }()
	select {
	case err := <-answer:
		return driver.Unavailable(ctx, err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

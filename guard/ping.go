package guard

import (
	"context"
	"fmt"

	"github.com/warden-go/warden/guard/driver"
)

// Ping checks that the backend answers (driver.Pinger), for health checks
// and for a program that should refuse to start on a wrong address. It
// returns nil, an error wrapping ErrUnavailable, ctx's error, or an error
// wrapping ErrUnsupported for a backend that cannot be pinged.
func (g *Guard) Ping(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("warden: ping: %w: nil context", ErrInvalidOption)
	}
	p, ok := g.locker.(driver.Pinger)
	if !ok {
		return fmt.Errorf("warden: ping: %w: %s cannot be pinged", ErrUnsupported, g.backend)
	}
	_, err := bounded(g, ctx, func(pctx context.Context) (struct{}, error) { return struct{}{}, p.Ping(pctx) })
	if err != nil {
		return fmt.Errorf("warden: ping %s: %w", g.backend, err)
	}
	return nil
}

package consullock

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

var _ driver.Pinger = (*Locker)(nil)

// Ping implements driver.Pinger: it asks the agent for the datacenter's
// leader, which an agent answers only when its servers have one, as locks
// need. The request is bounded by ctx and the request timeout, whatever
// the client's own options.
func (l *Locker) Ping(ctx context.Context) error {
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	leader, err := l.client.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(rctx))
	if err == nil && leader == "" {
		err = errors.New("no leader")
	}
	if err != nil {
		return l.fail(ctx, rctx, fmt.Errorf("ping: %w", err))
	}
	return nil
}

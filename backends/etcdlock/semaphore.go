package etcdlock

import (
	"context"
	"fmt"

	"github.com/warden-go/warden/guard/driver"
)

// AcquireSemaphore takes one of permits permits of key: the permits
// contenders with the lowest create revisions hold. Unlike locks, semaphore
// waiters all watch the key's whole range, since any release may be the one
// that admits them: a release wakes every waiter of that semaphore.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, permits int, opts driver.AcquireOptions) (driver.Lease, error) {
	if permits < 1 {
		return nil, fmt.Errorf("%w: %d semaphore permits", driver.ErrInvalidOption, permits)
	}
	return l.acquire(ctx, key, opts, counting, permits)
}

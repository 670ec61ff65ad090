package drivertest

import (
	"context"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// LateGrants is a Locker whose grants are answered only Late after they
// were made, their lease's time running meanwhile, as by a server that
// stalled while the acquisition waited for its answer. Late may be changed
// between acquisitions.
type LateGrants struct {
	driver.Locker
	Late time.Duration
}

// Acquire implements driver.Locker.
func (d *LateGrants) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	l, err := d.Locker.Acquire(ctx, key, o)
	if err == nil {
		time.Sleep(d.Late)
	}
	return l, err
}

package drivertest

import (
	"context"
	"sync"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// LateGrants is a Locker whose grants are answered only Late after they
// were made, their lease's time running meanwhile, as by a server that
// stalled while the acquisition waited for its answer. Late and
// OnTimeAfter may be changed between acquisitions.
type LateGrants struct {
	driver.Locker
	Late time.Duration
	// OnTimeAfter, when not zero, is how many grants are answered late:
	// those after them are answered at once.
	OnTimeAfter int

	mu   sync.Mutex
	late int // grants answered late so far
}

// Acquire implements driver.Locker.
func (d *LateGrants) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	l, err := d.Locker.Acquire(ctx, key, o)
	if err == nil && d.lateOne() {
		time.Sleep(d.Late)
	}
	return l, err
}

// LateOnes reports how many grants were answered late so far.
func (d *LateGrants) LateOnes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.late
}

func (d *LateGrants) lateOne() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.OnTimeAfter != 0 && d.late >= d.OnTimeAfter {
		return false
	}
	d.late++
	return true
}

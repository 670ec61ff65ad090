package etcdlock

import (
	"context"

	"github.com/warden-go/warden/guard/driver"
)

// AcquireRead takes key for reading: it waits only for writers that came
// before it, so readers share the lock, and a reader that comes after a
// waiting writer waits for that writer (writers are not starved).
func (l *Locker) AcquireRead(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, opts, shared, 0)
}

// AcquireWrite takes key for writing: it waits for every reader and writer
// that came before it. A writer excludes Acquire's holders too.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, opts, exclusive, 0)
}

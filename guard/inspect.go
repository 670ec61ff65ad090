package guard

import (
	"context"
	"fmt"

	"github.com/warden-go/warden/guard/driver"
)

// Inspection is who holds a lock and who waits for it, as the backend saw it
// at one moment.
type Inspection struct {
	// Key is the key as it was passed to Inspect, without the Guard's
	// prefix.
	Key string
	// Holders are the live holders, oldest grant first; none when the lock
	// is free.
	Holders []Holder
	// Waiters counts the contenders queued on the server, or is -1 where the
	// backend's waiters poll or listen instead of queueing.
	Waiters int
}

// Holder is one live holder of a lock. Its TTL is what was left of its lease
// on the server's clock when the server answered; it is 0 for a lease that
// lives as long as its holder's session (SessionBound).
type Holder = driver.Holding

// Inspect reports who holds key (in the Guard's namespace) and how many wait
// for it, without taking it. It needs a backend that implements
// driver.Inspector, and returns an error wrapping ErrUnsupported otherwise.
func (g *Guard) Inspect(ctx context.Context, key string) (Inspection, error) {
	if ctx == nil {
		return Inspection{}, wrapLockErr(key, fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	if err := ValidateKey(key); err != nil {
		return Inspection{}, wrapLockErr(key, err)
	}
	in, ok := g.locker.(driver.Inspector)
	if !ok {
		return Inspection{}, wrapLockErr(key, fmt.Errorf("%w: inspection on %s", ErrUnsupported, g.backend))
	}
	got, err := in.Inspect(ctx, g.names.full(g.prefix, key))
	if err != nil {
		return Inspection{}, wrapLockErr(key, err)
	}
	return Inspection{Key: key, Holders: got.Holders, Waiters: got.Waiters}, nil
}

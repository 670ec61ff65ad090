package driver

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff spaces the attempts of a backend that has to poll: each pause is
// drawn at random ("full jitter") from (0, bound], where the bound starts at
// Min, doubles with every attempt and never exceeds Max. However long a wait
// lasts, the bound stays at Max: there is no overflow and no table to run
// off the end of. The zero value pauses between 1ms and 1s.
type Backoff struct {
	// Min is the first bound (default 1ms).
	Min time.Duration
	// Max caps every pause (default 1s; raised to Min when below it).
	Max time.Duration

	bound time.Duration
}

// Next returns the next pause.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = time.Millisecond
	}
	if hi <= 0 {
		hi = time.Second
	}
	hi = max(hi, lo)
	switch {
	case b.bound < lo:
		b.bound = lo
	case b.bound > hi/2:
		b.bound = hi
	default:
		b.bound *= 2
	}
	return time.Duration(rand.Int64N(int64(b.bound))) + 1
}

// Reset starts the bounds again from Min, after progress.
func (b *Backoff) Reset() { b.bound = 0 }

// Sleep pauses for d, or until ctx is done (its error is returned then), or
// until wake receives; a nil wake is never ready.
func Sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

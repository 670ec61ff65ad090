package redislock

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// ownerID is what a lease is stored under: a random id that tells this
// lease from every other, then the holder's label for Inspect. The id is
// base32, so the first '/' ends it.
func ownerID(label string) string {
	if label == "" {
		return rand.Text()
	}
	return rand.Text() + "/" + label
}

func labelOf(owner string) string {
	_, label, _ := strings.Cut(owner, "/")
	return label
}

// Inspect implements driver.Inspector for plain and fair locks (the keys
// Acquire takes). Its token is the fence's current value, which is the
// holder's: the fence moves only when the lock is granted. Waiters counts
// the fair queue; waiters of plain locks listen instead of queueing, so they
// are not counted.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	n := namesOf(key)
	r, err := l.s.inspect.Run(ctx, l.sc, []string{n.lock(), n.fence(), n.queue()}).Slice()
	if err != nil {
		return driver.Inspection{}, driver.Unavailable(ctx, err)
	}
	if len(r) != 4 {
		return driver.Inspection{}, fmt.Errorf("%w: inspect answered %d values, want 4", driver.ErrUnavailable, len(r))
	}
	queued, _ := r[3].(int64)
	in := driver.Inspection{Waiters: int(queued)}
	owner, ok := r[0].(string)
	if !ok {
		return in, nil
	}
	pttl, _ := r[1].(int64)
	token, _ := r[2].(int64)
	in.Holders = []driver.Holding{{Owner: labelOf(owner), Token: uint64(token), TTL: time.Duration(max(pttl, 0)) * time.Millisecond}}
	return in, nil
}

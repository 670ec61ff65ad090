package driver

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"
)

// Inspector is an optional capability: reporting who holds a lock without
// taking it, for leader observation and for operators.
type Inspector interface {
	// Inspect reports key's current holders. An unheld key is not an error:
	// its Inspection has no holders. key is a lock key as Acquire gets it.
	Inspect(ctx context.Context, key string) (Inspection, error)
}

// Inspection is what an Inspector saw of one key, in one consistent read
// where the backend allows it.
type Inspection struct {
	// Holders are the live holders, oldest grant first: one for a mutex,
	// several for read locks or a semaphore.
	Holders []Holding
	// Waiters counts the contenders queued on the server, or is -1 where
	// the backend does not queue them (its waiters poll or listen).
	Waiters int
}

// Holding is one live holder of a key.
type Holding struct {
	// Owner is the label the holder acquired with (AcquireOptions.Owner),
	// empty when it gave none.
	Owner string
	// Token is the holder's fencing token.
	Token uint64
	// TTL is what was left of the lease on the server's clock when it
	// answered. It is 0 for a lease that lives as long as its holder's
	// session (SessionBound).
	TTL time.Duration
	// SessionBound: the lease ends with its holder's session (a ZooKeeper
	// ephemeral node, an etcd session lease, a database connection), not at
	// a time of its own.
	SessionBound bool
}

// MaxOwnerLen bounds AcquireOptions.Owner, so that backends can keep it
// beside the lease in a key, a node or a column of fixed width.
const MaxOwnerLen = 128

// CheckOwner reports why owner cannot label a lease, as an error wrapping
// ErrInvalidOption, or nil: it must be UTF-8 of at most MaxOwnerLen bytes
// without control characters. Empty is valid (no label).
func CheckOwner(owner string) error {
	if len(owner) > MaxOwnerLen {
		return fmt.Errorf("%w: owner label of %d bytes, more than %d", ErrInvalidOption, len(owner), MaxOwnerLen)
	}
	if !utf8.ValidString(owner) {
		return fmt.Errorf("%w: owner label %q is not UTF-8", ErrInvalidOption, owner)
	}
	for _, r := range owner {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: owner label %q has a control character", ErrInvalidOption, owner)
		}
	}
	return nil
}

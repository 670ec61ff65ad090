package etcd

import (
	"fmt"
	"strings"

	"github.com/warden-go/warden/guard"
)

// DefaultKeyPrefix is the etcd key prefix under which locks live unless
// WithKeyPrefix says otherwise.
const DefaultKeyPrefix = "warden/locks"

// Option configures a Locker.
type Option func(*config) error

type config struct {
	prefix string
}

// WithKeyPrefix puts every lock key under prefix (a trailing '/' is implied),
// so that warden's keys stay apart from the rest of the keyspace. Lockers that
// are to exclude each other must use the same prefix.
func WithKeyPrefix(prefix string) Option {
	return func(c *config) error {
		p := strings.TrimSuffix(prefix, "/")
		if p == "" {
			return fmt.Errorf("%w: empty etcd key prefix", guard.ErrInvalidOption)
		}
		c.prefix = p
		return nil
	}
}

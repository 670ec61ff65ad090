package driver

import (
	"fmt"
	"time"
)

// Limiter is an optional capability: a backend that cannot honour every TTL
// declares which it can, so that guard rejects a bad TTL when the Guard, the
// lock option or the scheduler job is built, not on the first acquisition.
type Limiter interface {
	Limits() Limits
}

// Limits are the TTLs a backend honours. Zero fields mean no limit.
type Limits struct {
	// MinTTL is the shortest TTL.
	MinTTL time.Duration
	// MaxTTL is the longest TTL.
	MaxTTL time.Duration
	// TTLStep: every TTL must be a whole multiple of it (etcd leases count
	// whole seconds).
	TTLStep time.Duration
}

// CheckTTL reports why ttl cannot be used, as an error wrapping
// ErrInvalidOption, or nil.
func (l Limits) CheckTTL(ttl time.Duration) error {
	switch {
	case ttl <= 0:
		return fmt.Errorf("%w: ttl %v is not positive", ErrInvalidOption, ttl)
	case l.MinTTL > 0 && ttl < l.MinTTL:
		return fmt.Errorf("%w: ttl %v is below the backend's minimum %v", ErrInvalidOption, ttl, l.MinTTL)
	case l.MaxTTL > 0 && ttl > l.MaxTTL:
		return fmt.Errorf("%w: ttl %v is above the backend's maximum %v", ErrInvalidOption, ttl, l.MaxTTL)
	case l.TTLStep > 0 && ttl%l.TTLStep != 0:
		return fmt.Errorf("%w: ttl %v is not a whole multiple of %v, the backend's unit", ErrInvalidOption, ttl, l.TTLStep)
	}
	return nil
}

// LimitsOf returns locker's Limits, or none when it declares none.
func LimitsOf(locker Locker) Limits {
	if l, ok := locker.(Limiter); ok {
		return l.Limits()
	}
	return Limits{}
}

package redislock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

var (
	//go:embed fence_check.lua
	fenceCheckSrc string
	//go:embed fence_write.lua
	fenceWriteSrc string
)

// DefaultFencePrefix prefixes a resource's name to make its fence key.
const DefaultFencePrefix = "warden:fence:"

// Fence makes fenced writes to Redis (package fence): each is one Lua script
// that checks the claim's token against the resource's fence key, writes,
// and advances it, or refuses with an error wrapping fence.ErrStaleToken and
// changes nothing. A write Redis refuses (WRONGTYPE, INCRBY of a value that
// is not an integer) changes nothing either; only Eval differs (see there).
//
// A resource's fence key is the prefix (DefaultFencePrefix) followed by the
// resource's name: a hash of its highest token and the ids of its latest 32
// writes, never expiring. The ids make a call that go-redis resends after a
// broken connection (its MaxRetries) apply once: the resent call finds its
// id and does nothing again. A write to the fence key itself (a resource
// named as its data key under WithFencePrefix("")) is refused with
// driver.ErrInvalidOption.
//
// On a Cluster, the fence key and the data keys a script touches must be in
// one hash slot: give the resource a hash tag and the data keys the same
// one, e.g. resource "{account:42}" (fence key
// "warden:fence:{account:42}") and data keys "{account:42}:balance" and
// "{account:42}:history". Redis refuses a script whose keys are in several
// slots (CROSSSLOT), before it writes anything. The lock's key can be the
// resource itself (guard.Do(ctx, "{account:42}", ...)), so that the default
// resource of fence.FromContext is the right one.
//
// Like every Redis write, the fence is replicated asynchronously: a
// failover to a replica that missed it forgets the latest tokens it
// accepted (as it forgets the data written with them).
type Fence struct {
	client goredis.Cmdable
	prefix string
	write  *goredis.Script
}

// FenceOption configures a Fence.
type FenceOption func(*Fence)

// WithFencePrefix replaces DefaultFencePrefix.
func WithFencePrefix(prefix string) FenceOption { return func(f *Fence) { f.prefix = prefix } }

// NewFence returns a Fence writing through client: a *goredis.Client, a
// *goredis.ClusterClient or a Sentinel failover client.
func NewFence(client goredis.Cmdable, opts ...FenceOption) (*Fence, error) {
	if client == nil {
		return nil, fmt.Errorf("warden: redislock: %w: nil client", driver.ErrInvalidOption)
	}
	f := &Fence{client: client, prefix: DefaultFencePrefix, write: goredis.NewScript(fenceCheckSrc + fenceWriteSrc)}
	for _, o := range opts {
		o(f)
	}
	return f, nil
}

// Key returns the fence key of resource.
func (f *Fence) Key(resource string) string { return f.prefix + resource }

// Set sets key to value, with an expiry when ttl is positive (whole
// milliseconds, rounded up), under c.
func (f *Fence) Set(ctx context.Context, c fence.Claim, key string, value any, ttl time.Duration) error {
	_, err := f.run(ctx, c, f.write, []string{key}, "set", value, pxOf(max(ttl, 0)))
	return fenceApplied(err)
}

// Del deletes keys under c.
func (f *Fence) Del(ctx context.Context, c fence.Claim, keys ...string) error {
	if len(keys) == 0 {
		return fmt.Errorf("warden: redislock: %w: Del of no key", driver.ErrInvalidOption)
	}
	_, err := f.run(ctx, c, f.write, keys, "del")
	return fenceApplied(err)
}

// HSet sets the fields of the hash key under c; values are field, value,
// field, value...
func (f *Fence) HSet(ctx context.Context, c fence.Claim, key string, values ...any) error {
	if len(values) == 0 || len(values)%2 != 0 {
		return fmt.Errorf("warden: redislock: %w: HSet takes field, value pairs, got %d values", driver.ErrInvalidOption, len(values))
	}
	_, err := f.run(ctx, c, f.write, []string{key}, append([]any{"hset"}, values...)...)
	return fenceApplied(err)
}

// IncrBy adds n to the integer at key under c and returns the sum. A call
// resent after a broken connection that finds itself already applied
// returns ErrReplyLost: it was applied once, its sum is not known.
func (f *Fence) IncrBy(ctx context.Context, c fence.Claim, key string, n int64) (int64, error) {
	r, err := f.run(ctx, c, f.write, []string{key}, "incrby", n)
	if err != nil {
		return 0, err
	}
	return r.(int64), nil
}

// Eval runs the caller's Lua script under c: keys and args are the script's
// own KEYS and ARGV, and it runs after the fence's check and advance, in the
// same script, only when the claim is accepted. It returns the script's
// result, or ErrReplyLost as IncrBy does. The script runs as is: its own
// errors leave the fence advanced, since Redis keeps what a script wrote
// before its error, and those writes must be fenced.
func (f *Fence) Eval(ctx context.Context, c fence.Claim, script string, keys []string, args ...any) (any, error) {
	return f.run(ctx, c, goredis.NewScript(fenceCheckSrc+"warden_advance()\n"+script), keys, args...)
}

// Advance checks and advances c's resource without writing: fence.Fencer.
func (f *Fence) Advance(ctx context.Context, c fence.Claim) error {
	_, err := f.run(ctx, c, f.write, nil, "advance")
	return fenceApplied(err)
}

// Highest returns the highest token resource accepted, 0 if none.
func (f *Fence) Highest(ctx context.Context, resource string) (uint64, error) {
	s, err := f.client.HGet(ctx, f.Key(resource), "t").Result()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, driver.Unavailable(ctx, fmt.Errorf("warden: redislock: fence %q: %w", resource, err))
	}
	return strconv.ParseUint(s, 10, 64)
}

// ErrReplyLost: a fenced write that returns a result (IncrBy, Eval) was
// applied, but the reply that carried its result was lost and the call was
// resent; it was not applied again.
var ErrReplyLost = errors.New("warden: redislock: the fenced write was applied once, its reply was lost")

// fenceApplied is err, except that a write without a result that was applied
// once and resent has nothing more to report.
func fenceApplied(err error) error {
	if errors.Is(err, ErrReplyLost) {
		return nil
	}
	return err
}

func (f *Fence) run(ctx context.Context, c fence.Claim, s *goredis.Script, keys []string, args ...any) (any, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	fenceKey := f.Key(c.Resource)
	if slices.Contains(keys, fenceKey) {
		// Deleting the fence would let every lower token write again,
		// overwriting it would break it.
		return nil, fmt.Errorf("warden: redislock: %w: fenced write to %q, the fence key of %q itself", driver.ErrInvalidOption, fenceKey, c.Resource)
	}
	var id [8]byte
	rand.Read(id[:])
	r, err := s.Run(ctx, f.client, append([]string{fenceKey}, keys...),
		append([]any{strconv.FormatUint(c.Token, 10), hex.EncodeToString(id[:])}, args...)...).Result()
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	var re goredis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		switch {
		case strings.HasPrefix(msg, "WARDEN_APPLIED "):
			return nil, ErrReplyLost
		case strings.HasPrefix(msg, "WARDEN_STALE "):
			high, _ := strconv.ParseUint(strings.TrimPrefix(msg, "WARDEN_STALE "), 10, 64)
			return nil, fence.Stale(c, high)
		}
		return nil, fmt.Errorf("warden: redislock: fenced write on %q: %w", c.Resource, err)
	}
	if err != nil {
		return nil, driver.Unavailable(ctx, fmt.Errorf("warden: redislock: fenced write on %q: %w", c.Resource, err))
	}
	return r, nil
}

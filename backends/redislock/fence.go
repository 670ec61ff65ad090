package redislock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/rediseval"
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
// resource's name: a hash of its highest token (field "t"), never expiring.
// A write to the fence key itself (a resource named as its data key under
// WithFencePrefix("")) is refused with driver.ErrInvalidOption.
//
// Each write is sent once: go-redis does not resend it after a broken
// connection or a timed-out read (its MaxRetries), since a resend of a
// write the server applied would apply it twice, or be refused as stale
// after a newer holder's write although it was applied. Such a write ends
// with an error wrapping ErrOutcomeUnknown and driver.ErrUnavailable: it
// may have been applied, once, or not at all, and the caller finds out by
// reading the data (with its token still the highest, a fenced write of
// its own settles the order). A Cluster's redirections (MOVED, ASK) are
// still followed: the node that answers them ran nothing. So is a slot
// migration's TRYAGAIN, which a write gets while its keys are split
// between the two nodes, or while some of them are not yet written (a new
// data key, a resource's first fence): the write is sent again, with
// growing pauses, until the slot settles, and fails as unavailable, not
// applied, when ctx ends first. A write that fails so, or that never left
// the client (no connection, a context already done), matches
// driver.ErrNotSent as well.
//
// With go-redis's default options a write to a server that stopped
// answering waits out the client's ReadTimeout (3 s), whatever its context
// says: Locker.BoundedByDeadline lists the options that end it with ctx.
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
	client rediseval.Client
	prefix string
	write  fenceScript
	// slots sends a write again while its slot moves, reloading a Cluster
	// client's slot map as the Locker's scripts do.
	slots resender
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
	p, ok := client.(rediseval.Client)
	if !ok {
		return nil, fmt.Errorf("warden: redislock: %w: NewFence of a %T, which cannot send a command of its own", driver.ErrInvalidOption, client)
	}
	f := &Fence{client: p, prefix: DefaultFencePrefix, write: newFenceScript(fenceCheckSrc + fenceWriteSrc)}
	f.slots.cluster, _ = client.(*goredis.ClusterClient)
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
	return err
}

// Del deletes keys under c.
func (f *Fence) Del(ctx context.Context, c fence.Claim, keys ...string) error {
	if len(keys) == 0 {
		return fmt.Errorf("warden: redislock: %w: Del of no key", driver.ErrInvalidOption)
	}
	_, err := f.run(ctx, c, f.write, keys, "del")
	return err
}

// HSet sets the fields of the hash key under c; values are field, value,
// field, value...
func (f *Fence) HSet(ctx context.Context, c fence.Claim, key string, values ...any) error {
	if len(values) == 0 || len(values)%2 != 0 {
		return fmt.Errorf("warden: redislock: %w: HSet takes field, value pairs, got %d values", driver.ErrInvalidOption, len(values))
	}
	_, err := f.run(ctx, c, f.write, []string{key}, append([]any{"hset"}, values...)...)
	return err
}

// IncrBy adds n to the integer at key under c and returns the sum.
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
// result. The script runs as is: its own
// errors leave the fence advanced, since Redis keeps what a script wrote
// before its error, and those writes must be fenced.
func (f *Fence) Eval(ctx context.Context, c fence.Claim, script string, keys []string, args ...any) (any, error) {
	return f.run(ctx, c, newFenceScript(fenceCheckSrc+"warden_advance()\n"+script), keys, args...)
}

// Advance checks and advances c's resource without writing: fence.Fencer.
func (f *Fence) Advance(ctx context.Context, c fence.Claim) error {
	_, err := f.run(ctx, c, f.write, nil, "advance")
	return err
}

// Highest returns the highest token resource accepted, 0 if none, read on
// the resource's master even by a client that reads from replicas (see
// resender.readsReplicas), where the token may not have come yet.
func (f *Fence) Highest(ctx context.Context, resource string) (uint64, error) {
	key := f.Key(resource)
	hget := func(c rediseval.Client) *goredis.Cmd {
		cmd := goredis.NewCmd(ctx, "hget", key, "t")
		_ = c.Process(ctx, cmd)
		return cmd
	}
	var cmd *goredis.Cmd
	if f.slots.readsReplicas() {
		cmd = f.slots.onMaster(ctx, key, func(m masterConn) *goredis.Cmd { return hget(m) })
	} else {
		cmd = hget(f.client)
	}
	s, err := cmd.Text()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, driver.Unavailable(ctx, fmt.Errorf("warden: redislock: fence %q: %w", resource, err))
	}
	return strconv.ParseUint(s, 10, 64)
}

// ErrOutcomeUnknown: a fenced write was sent and no reply came back (the
// connection broke, a read timed out, the context ended): the server may
// have applied it, once, or not. It is not sent again. Errors wrapping it
// wrap driver.ErrUnavailable too.
var ErrOutcomeUnknown = errors.New("warden: redislock: fenced write sent, no reply: applied once or not at all")

// fenceScript is a script of the Fence, sent by its digest (EVALSHA), and
// whole when the server answers NOSCRIPT.
type fenceScript struct{ src, sha string }

func newFenceScript(src string) fenceScript {
	return fenceScript{src: src, sha: goredis.NewScript(src).Hash()}
}

// eval runs s once. NOSCRIPT is an answer: the server ran nothing, and the
// script is sent whole. So are the answers of a slot migration (see
// migrating): the script is sent again, with growing pauses, until the slot
// settles or ctx ends, and a node's answer that it serves the slot no more
// has a Cluster client's slot map reloaded first (see resender).
func (f *Fence) eval(ctx context.Context, s fenceScript, keys []string, args []any) (any, error) {
	send := func(name, script string) (any, error) {
		argv := scriptArgs(name, script, keys, args)
		return f.slots.retry(ctx, func() *goredis.Cmd { return rediseval.EvalOnce(ctx, f.client, argv...) }).Result()
	}
	r, err := send("evalsha", s.sha)
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		return send("eval", s.src)
	}
	return r, err
}

func (f *Fence) run(ctx context.Context, c fence.Claim, s fenceScript, keys []string, args ...any) (any, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// Known not sent, which go-redis's error would not tell.
		return nil, driver.NotSent(err)
	}
	fenceKey := f.Key(c.Resource)
	if slices.Contains(keys, fenceKey) {
		// Deleting the fence would let every lower token write again,
		// overwriting it would break it.
		return nil, fmt.Errorf("warden: redislock: %w: fenced write to %q, the fence key of %q itself", driver.ErrInvalidOption, fenceKey, c.Resource)
	}
	r, err := f.eval(ctx, s, append([]string{fenceKey}, keys...), append([]any{strconv.FormatUint(c.Token, 10)}, args...))
	if errors.Is(err, goredis.Nil) {
		return nil, nil
	}
	var re goredis.Error
	switch {
	case err == nil:
		return r, nil
	case migrating(err):
		// Sent again until ctx ended, and never run: marked after
		// driver.Unavailable, which gives ctx's error alone.
		return nil, driver.NotSent(driver.Unavailable(ctx, fmt.Errorf("warden: redislock: fenced write on %q: %w", c.Resource, err)))
	case errors.As(err, &re):
		if high, ok := strings.CutPrefix(re.Error(), "WARDEN_STALE "); ok {
			h, _ := strconv.ParseUint(high, 10, 64)
			return nil, fence.Stale(c, h)
		}
		return nil, fmt.Errorf("warden: redislock: fenced write on %q: %w", c.Resource, err)
	case rediseval.Unsent(err):
		return nil, driver.NotSent(driver.Unavailable(ctx, fmt.Errorf("warden: redislock: fenced write on %q: %w", c.Resource, err)))
	}
	return nil, fmt.Errorf("%w: %w: fenced write on %q: %w", driver.ErrUnavailable, ErrOutcomeUnknown, c.Resource, err)
}

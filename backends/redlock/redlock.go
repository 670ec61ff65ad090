package redlock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/redistag"
	"github.com/warden-go/warden/guard/driver"
)

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed fence.lua
	fenceSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string
)

// Locker is a warden lock backend on N independent Redis masters, by the
// RedLock algorithm, with fencing tokens. It implements driver.Locker and
// driver.Limiter, and is safe for concurrent use.
type Locker struct {
	nodes       []goredis.UniversalClient
	quorum      int
	nodeTimeout time.Duration
	driftFactor float64
	maxBackoff  time.Duration

	acquire, fence, release, refresh *goredis.Script
}

// Option configures a Locker.
type Option func(*Locker) error

// WithNodeTimeout bounds each call to one node (default 200ms, room for
// nodes that fsync every write, as appendfsync always does). A node that is
// down or hangs costs at most this, and all nodes are asked in parallel. It
// must be far below the lock TTL: the shortest TTL the Locker accepts is
// MinTTLFactor times it.
func WithNodeTimeout(d time.Duration) Option {
	return func(l *Locker) error {
		if d <= 0 {
			return fmt.Errorf("%w: node timeout %v", driver.ErrInvalidOption, d)
		}
		l.nodeTimeout = d
		return nil
	}
}

// WithDriftFactor sets the share of the TTL allowed for clock drift between
// the nodes' expiry timers and ours (default 0.01); 2ms are added to it.
func WithDriftFactor(f float64) Option {
	return func(l *Locker) error {
		if f < 0 || f >= 0.5 {
			return fmt.Errorf("%w: drift factor %v, want [0, 0.5)", driver.ErrInvalidOption, f)
		}
		l.driftFactor = f
		return nil
	}
}

// WithMaxBackoff caps the pause between two attempts of a waiting Acquire
// (default 250ms); the pauses grow from a few milliseconds, jittered.
func WithMaxBackoff(d time.Duration) Option {
	return func(l *Locker) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: max backoff %v", driver.ErrInvalidOption, d)
		}
		l.maxBackoff = d
		return nil
	}
}

// New returns a Locker on nodes, which must be independent masters (no
// replication between them), an odd number and at least 3; 5 is the
// recommended count. The caller keeps ownership of the clients.
func New(nodes []goredis.UniversalClient, opts ...Option) (*Locker, error) {
	if len(nodes) < 3 || len(nodes)%2 == 0 {
		return nil, fmt.Errorf("%w: %d nodes, want an odd number, at least 3", driver.ErrInvalidOption, len(nodes))
	}
	l := &Locker{
		nodes:       nodes,
		quorum:      len(nodes)/2 + 1,
		nodeTimeout: 200 * time.Millisecond,
		driftFactor: 0.01,
		maxBackoff:  250 * time.Millisecond,
		acquire:     goredis.NewScript(acquireSrc),
		fence:       goredis.NewScript(fenceSrc),
		release:     goredis.NewScript(releaseSrc),
		refresh:     goredis.NewScript(refreshSrc),
	}
	for i, n := range nodes {
		if n == nil {
			return nil, fmt.Errorf("%w: node %d is nil", driver.ErrInvalidOption, i)
		}
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

var (
	_ driver.Locker  = (*Locker)(nil)
	_ driver.Limiter = (*Locker)(nil)
)

// MinTTLFactor: a TTL must be at least this many node timeouts, so that an
// acquisition round that takes its full timeout still leaves most of the
// TTL as validity.
const MinTTLFactor = 5

// Limits implements driver.Limiter: TTLs of at least MinTTLFactor node
// timeouts, counted in whole milliseconds by the nodes.
func (l *Locker) Limits() driver.Limits {
	return driver.Limits{MinTTL: MinTTLFactor * l.nodeTimeout, TTLStep: time.Millisecond}
}

// Acquire takes key on a majority of the nodes. Fair mode is not offered
// (driver.ErrUnsupported). A waiting Acquire retries after a jittered pause
// that grows to WithMaxBackoff and never past it however long the wait, is
// never longer than the holder's remaining TTL as the nodes report it, and
// goes on through nodes that fail (ErrUnavailable) until ctx is done.
func (l *Locker) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	if opts.Fair {
		return nil, fmt.Errorf("%w: fair mode with RedLock", driver.ErrUnsupported)
	}
	ls := &lease{l: l, key: key, owner: rand.Text()}
	backoff := driver.Backoff{Min: 2 * time.Millisecond, Max: l.maxBackoff}
	for {
		hint, err := l.try(ctx, ls, opts.TTL)
		if err == nil {
			return ls, nil
		}
		if !opts.Wait || !(errors.Is(err, driver.ErrNotAcquired) || errors.Is(err, driver.ErrUnavailable)) {
			return nil, err
		}
		d := backoff.Next()
		if hint > 0 && hint < d {
			d = hint
		}
		if err := driver.Sleep(ctx, d, nil); err != nil {
			return nil, err
		}
	}
}

// try makes one attempt. On failure it has released every node (including
// those whose answer it did not get) and returns how long the holder's votes
// still last, as a hint for the next attempt.
func (l *Locker) try(ctx context.Context, ls *lease, ttl time.Duration) (time.Duration, error) {
	start := time.Now()
	ms := ttl.Milliseconds()
	lock, fence := keysOf(ls.key)
	votes := l.each(ctx, func(ctx context.Context, n goredis.UniversalClient) (any, error) {
		return l.acquire.Run(ctx, n, []string{lock, fence}, ls.owner, ms).Int64Slice()
	})
	var (
		granted  []int
		maxFence int64
		failed   int
		hint     time.Duration
	)
	for i, v := range votes {
		switch {
		case v.err != nil:
			failed++
		case v.val.([]int64)[0] == 1:
			granted = append(granted, i)
			maxFence = max(maxFence, v.val.([]int64)[1])
		default:
			if p := time.Duration(v.val.([]int64)[1]) * time.Millisecond; p > 0 && (hint == 0 || p < hint) {
				hint = p
			}
		}
	}
	fail := func(err error) (time.Duration, error) {
		l.releaseAll(ctx, ls)
		if ctxErr := ctx.Err(); ctxErr != nil {
			return 0, ctxErr
		}
		return hint, err
	}
	if len(granted) < l.quorum {
		return fail(l.shortfall(failed, firstErr(votes)))
	}
	// The token goes above every counter in this majority, and is written
	// back to all of it before the lease is handed out: any later majority
	// shares a node with this one and reads a counter at least this high.
	token := maxFence + 1
	written := l.each(ctx, func(ctx context.Context, n goredis.UniversalClient) (any, error) {
		return l.fence.Run(ctx, n, []string{lock, fence}, ls.owner, token).Int64()
	}, granted...)
	ok, unwritten := 0, 0
	for _, w := range written {
		switch {
		case w.err != nil:
			unwritten++
		case w.val.(int64) == 1:
			ok++
		}
	}
	if ok < l.quorum {
		return fail(l.shortfall(failed+unwritten, firstErr(written)))
	}
	expiry := l.expiry(ttl, start)
	if !time.Now().Before(expiry) {
		return fail(fmt.Errorf("%w: acquiring took longer than the TTL %v", driver.ErrNotAcquired, ttl))
	}
	ls.token = uint64(token)
	ls.setExpiry(expiry)
	return 0, nil
}

// expiry is the time before which the votes of a round that started at
// start surely last on every node that granted them: the round's start plus
// the TTL, less an allowance for the nodes' timers drifting from ours. Its
// distance from now is RedLock's validity.
func (l *Locker) expiry(ttl time.Duration, start time.Time) time.Time {
	drift := time.Duration(float64(ttl)*l.driftFactor) + 2*time.Millisecond
	return start.Add(ttl - drift)
}

// shortfall explains a missing majority: ErrUnavailable when too many nodes
// failed for a majority to be possible, ErrNotAcquired when others hold it.
func (l *Locker) shortfall(failed int, cause error) error {
	if failed > len(l.nodes)-l.quorum {
		return fmt.Errorf("%w: %d of %d nodes failed: %w", driver.ErrUnavailable, failed, len(l.nodes), cause)
	}
	return fmt.Errorf("%w: no majority of %d nodes", driver.ErrNotAcquired, len(l.nodes))
}

// releaseAll withdraws the owner's votes from every node, those that seemed
// to fail included: a node may have granted a vote whose answer was lost.
func (l *Locker) releaseAll(ctx context.Context, ls *lease) []result {
	ctx = context.WithoutCancel(ctx)
	lock, _ := keysOf(ls.key)
	return l.each(ctx, func(ctx context.Context, n goredis.UniversalClient) (any, error) {
		return l.release.Run(ctx, n, []string{lock}, ls.owner).Int64()
	})
}

type result struct {
	val any
	err error
}

// each calls f on the nodes (all of them when which is empty) in parallel,
// each bounded by the node timeout. A node that does not answer in time
// counts as failed even if its client ignores the context's deadline: its
// call finishes in the background.
func (l *Locker) each(ctx context.Context, f func(context.Context, goredis.UniversalClient) (any, error), which ...int) []result {
	if len(which) == 0 {
		which = make([]int, len(l.nodes))
		for i := range which {
			which[i] = i
		}
	}
	out := make([]result, len(which))
	type answer struct {
		i int
		result
	}
	answers := make(chan answer, len(which))
	for j, i := range which {
		go func() {
			nctx, cancel := context.WithTimeout(ctx, l.nodeTimeout)
			defer cancel()
			v, err := f(nctx, l.nodes[i])
			answers <- answer{j, result{v, err}}
		}()
	}
	timeout := time.NewTimer(l.nodeTimeout)
	defer timeout.Stop()
	got := make([]bool, len(which))
	for range which {
		select {
		case a := <-answers:
			out[a.i], got[a.i] = a.result, true
			continue
		case <-timeout.C:
		case <-ctx.Done():
		}
		break
	}
	for j := range out {
		if !got[j] {
			out[j].err = fmt.Errorf("node %d: no answer within %v", which[j], l.nodeTimeout)
		}
	}
	return out
}

func firstErr(rs []result) error {
	for _, r := range rs {
		if r.err != nil {
			return r.err
		}
	}
	return errors.New("no error")
}

// keysOf names the lock and fence keys of key on every node; they share a
// hash tag, as a script's keys must on a Cluster node.
func keysOf(key string) (lock, fence string) {
	tag := "{" + redistag.Escape(key) + "}:"
	return tag + "lock", tag + "fence"
}

// Ping implements driver.Pinger: nil when a majority of the nodes answer
// PING within the node timeout, which is what a lock needs.
func (l *Locker) Ping(ctx context.Context) error {
	rs := l.each(ctx, func(ctx context.Context, c goredis.UniversalClient) (any, error) {
		return nil, c.Ping(ctx).Err()
	})
	up := 0
	for _, r := range rs {
		if r.err == nil {
			up++
		}
	}
	if up >= l.quorum {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: redlock: %d of %d nodes answered, %d needed: %w", driver.ErrUnavailable, up, len(l.nodes), l.quorum, firstErr(rs))
}

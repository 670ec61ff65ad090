package redlock

import (
	"context"
	crand "crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/warden-go/warden/backends/internal/redistag"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
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
// RedLock algorithm, with fencing tokens. It implements guard.Locker and is
// safe for concurrent use.
type Locker struct {
	nodes       []goredis.UniversalClient
	quorum      int
	nodeTimeout time.Duration
	driftFactor float64
	prefix      string
	maxBackoff  time.Duration

	acquire, fence, release, refresh *goredis.Script
}

// Option configures a Locker.
type Option func(*Locker) error

// WithNodeTimeout bounds each call to one node (default 50ms). It must be far
// below the lock TTL: a node that is down or hangs costs at most this, and
// all nodes are asked in parallel.
func WithNodeTimeout(d time.Duration) Option {
	return func(l *Locker) error {
		if d <= 0 {
			return fmt.Errorf("%w: node timeout %v", guard.ErrInvalidOption, d)
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
			return fmt.Errorf("%w: drift factor %v, want [0, 0.5)", guard.ErrInvalidOption, f)
		}
		l.driftFactor = f
		return nil
	}
}

// WithPrefix sets the prefix of every key on the nodes (default "warden:").
func WithPrefix(prefix string) Option {
	return func(l *Locker) error {
		l.prefix = redistag.Escape(prefix)
		return nil
	}
}

// WithMaxBackoff caps the pause between two attempts of a waiting Acquire
// (default 250ms); the pauses grow from a few milliseconds, jittered.
func WithMaxBackoff(d time.Duration) Option {
	return func(l *Locker) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: max backoff %v", guard.ErrInvalidOption, d)
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
		return nil, fmt.Errorf("%w: %d nodes, want an odd number, at least 3", guard.ErrInvalidOption, len(nodes))
	}
	l := &Locker{
		nodes:       nodes,
		quorum:      len(nodes)/2 + 1,
		nodeTimeout: 50 * time.Millisecond,
		driftFactor: 0.01,
		prefix:      "warden:",
		maxBackoff:  250 * time.Millisecond,
		acquire:     goredis.NewScript(acquireSrc),
		fence:       goredis.NewScript(fenceSrc),
		release:     goredis.NewScript(releaseSrc),
		refresh:     goredis.NewScript(refreshSrc),
	}
	for _, o := range opts {
		if err := o(l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

var _ guard.Locker = (*Locker)(nil)

// Acquire takes key on a majority of the nodes. Fair mode is not offered
// (guard.ErrUnsupported). A waiting Acquire retries with jittered, growing
// pauses, never longer than the holder's remaining TTL as the nodes report it.
func (l *Locker) Acquire(ctx context.Context, key string, opts guard.AcquireOptions) (guard.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts.TTL < time.Millisecond {
		return nil, fmt.Errorf("%w: TTL %v, want at least 1ms", guard.ErrInvalidOption, opts.TTL)
	}
	if opts.Fair {
		return nil, fmt.Errorf("%w: fair mode with RedLock", guard.ErrUnsupported)
	}
	ls := &lease{l: l, key: key, owner: newOwner(), lock: l.keyFor(key, "lock"), fenceKey: l.keyFor(key, "fence")}
	backoff := 2 * time.Millisecond
	for {
		hint, err := l.try(ctx, ls, opts.TTL)
		if err == nil {
			return ls, nil
		}
		if !opts.Wait || !errors.Is(err, guard.ErrNotAcquired) {
			return nil, err
		}
		d := min(backoff, l.maxBackoff)
		if hint > 0 && hint < d {
			d = hint
		}
		// Jitter keeps contenders that split the votes from colliding again.
		d = d/2 + rand.N(d/2+1)
		backoff *= 2
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// try makes one attempt. On failure it has released every node (including
// those whose answer it did not get) and returns how long the holder's votes
// still last, as a hint for the next attempt.
func (l *Locker) try(ctx context.Context, ls *lease, ttl time.Duration) (time.Duration, error) {
	start := time.Now()
	ms := ttl.Milliseconds()
	votes := l.each(ctx, func(ctx context.Context, n goredis.UniversalClient) (any, error) {
		return l.acquire.Run(ctx, n, []string{ls.lock, ls.fenceKey}, ls.owner, ms).Int64Slice()
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
		return fail(l.shortfall(ls.key, failed, firstErr(votes)))
	}
	// The token goes above every counter in this majority, and is written
	// back to all of it before the lease is handed out: any later majority
	// shares a node with this one and reads a counter at least this high.
	token := maxFence + 1
	written := l.each(ctx, func(ctx context.Context, n goredis.UniversalClient) (any, error) {
		return l.fence.Run(ctx, n, []string{ls.lock, ls.fenceKey}, ls.owner, token).Int64()
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
		return fail(l.shortfall(ls.key, failed+unwritten, firstErr(written)))
	}
	if l.validity(ttl, start) <= 0 {
		return fail(fmt.Errorf("%w: %q: acquiring took longer than the TTL %v", guard.ErrNotAcquired, ls.key, ttl))
	}
	ls.token = uint64(token)
	return 0, nil
}

// validity is how long a majority's votes certainly last: the TTL less the
// time the round took and an allowance for the nodes' timers drifting.
func (l *Locker) validity(ttl time.Duration, start time.Time) time.Duration {
	drift := time.Duration(float64(ttl)*l.driftFactor) + 2*time.Millisecond
	return ttl - time.Since(start) - drift
}

// shortfall explains a missing majority: ErrUnavailable when too many nodes
// failed for a majority to be possible, ErrNotAcquired when others hold it.
func (l *Locker) shortfall(key string, failed int, cause error) error {
	if failed > len(l.nodes)-l.quorum {
		return fmt.Errorf("%w: %q: %d of %d nodes failed: %w", guard.ErrUnavailable, key, failed, len(l.nodes), cause)
	}
	return fmt.Errorf("%w: %q: no majority of %d nodes", guard.ErrNotAcquired, key, len(l.nodes))
}

// releaseAll withdraws the owner's votes from every node, those that seemed
// to fail included: a node may have granted a vote whose answer was lost.
func (l *Locker) releaseAll(ctx context.Context, ls *lease) []result {
	ctx = context.WithoutCancel(ctx)
	return l.each(ctx, func(ctx context.Context, n goredis.UniversalClient) (any, error) {
		return l.release.Run(ctx, n, []string{ls.lock}, ls.owner).Int64()
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

func (l *Locker) keyFor(key, suffix string) string {
	return l.prefix + "{" + redistag.Escape(key) + "}:" + suffix
}

// newOwner returns a random, unguessable owner id.
func newOwner() string {
	var b [16]byte
	crand.Read(b[:]) // never fails (crypto/rand documents it)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

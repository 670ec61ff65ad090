package redlock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/rediseval"
	"github.com/warden-go/warden/backends/internal/redisrefusal"
	"github.com/warden-go/warden/backends/internal/redisstate"
	"github.com/warden-go/warden/backends/internal/redistag"
	"github.com/warden-go/warden/guard/driver"
)

var (
	// voteSrc defines how the scripts read and write a node's vote.
	//go:embed state.lua
	voteSrc string
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
// RedLock algorithm, with fencing tokens. It implements driver.Locker,
// driver.Limiter, driver.Pinger and driver.ContextBounded, and is safe for
// concurrent use.
type Locker struct {
	nodes       []goredis.UniversalClient
	quorum      int
	nodeTimeout time.Duration
	driftFactor float64
	maxBackoff  time.Duration

	acquire, fence, release, refresh *goredis.Script
	// The digests of the scripts every round sends, as interface values
	// for evalsha, converted once.
	acquireSha, releaseSha, refreshSha any
	// leadBound is the bound on a proposal's lead over a node's clock
	// (µs, the node timeout) as the vote takes it, converted once.
	leadBound any
	// all indexes every node, for rounds on all of them; ring is all
	// twice, so that any len(nodes) nodes in turn are one slice of it.
	all, ring []int
	// probes counts the waiters' probes, which start one node further on
	// each time (see probeNodes).
	probes atomic.Uint32
	// silent says, by node, that the node failed the last vote or probe
	// sent to it: probes ask it only after the others (see probeNodes).
	silent []atomic.Bool
	// withdrawing holds, by lock, the end of a withdrawal of this
	// Locker's votes that its caller's ctx left under way: a channel
	// closed when it is over (see withdraw).
	withdrawing sync.Map

	// fenceBase is the highest fence a node reported, less the local
	// monotonic time (µs since epoch) at which the round that read it was
	// sent: the base of token proposals (see propose). 0 until known.
	fenceBase atomic.Int64

	// ids are the nodes' servers as last read (see identify); reading
	// holds the one read under way.
	ids     atomic.Pointer[identities]
	reading chan struct{}
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
// recommended count. Every Locker of a lock must be given the same nodes, in
// any order (see the package doc). One client listed twice is an error
// wrapping driver.ErrInvalidOption, as is a nil client, and a cluster or
// ring client (its INFO goes to any of its servers, so its server cannot be
// known). So is one server behind two clients (one address twice, 127.0.0.1
// and localhost, two dialers of their own), which New, making no request,
// cannot see: the first acquisition or Ping reads each node's run_id (INFO
// server) and fails with that error, naming the two addresses. The caller
// keeps ownership of the clients.
func New(nodes []goredis.UniversalClient, opts ...Option) (*Locker, error) {
	if len(nodes) < 3 || len(nodes)%2 == 0 {
		return nil, fmt.Errorf("%w: %d nodes, want an odd number, at least 3", driver.ErrInvalidOption, len(nodes))
	}
	stateSrc := redisstate.Lua + voteSrc
	l := &Locker{
		nodes:       nodes,
		quorum:      len(nodes)/2 + 1,
		nodeTimeout: 200 * time.Millisecond,
		driftFactor: 0.01,
		maxBackoff:  250 * time.Millisecond,
		acquire:     goredis.NewScript(acquireSrc),
		fence:       goredis.NewScript(stateSrc + fenceSrc),
		release:     goredis.NewScript(releaseSrc),
		refresh:     goredis.NewScript(refreshSrc),
		reading:     make(chan struct{}, 1),
	}
	l.acquireSha, l.releaseSha, l.refreshSha = l.acquire.Hash(), l.release.Hash(), l.refresh.Hash()
	l.ring = make([]int, 2*len(nodes))
	for i := range l.ring {
		l.ring[i] = i % len(nodes)
	}
	l.all = l.ring[:len(nodes)]
	l.silent = make([]atomic.Bool, len(nodes))
	// A server listed twice casts two votes: a minority of the servers
	// would then make a majority of the nodes, and one server's restart
	// without persistence would lose the lock. One client listed twice is
	// refused here; two clients of one server, whatever they dial (one
	// address twice, two spellings of it, two dialers of their own that
	// go-redis gives the same default address), are found on first use
	// by the server's identity (see identify): an address says too little
	// to refuse them here.
	seen := make(map[goredis.UniversalClient]int, len(nodes))
	for i, n := range nodes {
		if n == nil {
			return nil, fmt.Errorf("%w: node %d is nil", driver.ErrInvalidOption, i)
		}
		switch c := n.(type) {
		case *goredis.Client:
			// A nil pointer is not a nil interface: the first request to
			// it would panic on one of the Locker's goroutines.
			if c == nil {
				return nil, fmt.Errorf("%w: node %d is a nil *redis.Client", driver.ErrInvalidOption, i)
			}
		case *goredis.ClusterClient, *goredis.Ring:
			// INFO, naming no key, goes to any of their servers, not the
			// one that holds a lock's vote: their identity cannot be read.
			return nil, fmt.Errorf("%w: node %d is a %T: each node must be a client of one server", driver.ErrInvalidOption, i, n)
		}
		if j, ok := seen[n]; ok {
			return nil, fmt.Errorf("%w: nodes %d and %d are one client", driver.ErrInvalidOption, j, i)
		}
		seen[n] = i
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(l); err != nil {
			return nil, err
		}
	}
	l.leadBound = l.nodeTimeout.Microseconds()
	return l, nil
}

var (
	_ driver.Locker         = (*Locker)(nil)
	_ driver.Limiter        = (*Locker)(nil)
	_ driver.Pinger         = (*Locker)(nil)
	_ driver.ContextBounded = (*Locker)(nil)
)

// BoundedByContext implements driver.ContextBounded: always true. Every
// request to a node is made by gather, on a goroutine of its own, and
// gather stops waiting once ctx is done (or the node timeout has passed),
// whatever the client does: go-redis with its default options ignores
// ctx while it reads an answer. Pauses are driver.Sleep on ctx, and the
// withdrawal of a failed attempt's votes, which must reach the nodes
// whatever ctx's state, goes on in the background once ctx is done. guard
// then calls the Locker on the caller's goroutine instead of handing each
// acquisition and release to one of its own, which would only add a
// goroutine switch to the ones gather makes.
func (l *Locker) BoundedByContext() bool { return true }

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
// goes on through nodes that fail (ErrUnavailable) until ctx is done,
// unless so many refuse the vote, or the waiter's read of their state, for
// good (see redisrefusal) that no majority can grant it.
func (l *Locker) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	if opts.Fair {
		return nil, fmt.Errorf("%w: fair mode with RedLock", driver.ErrUnsupported)
	}
	lock := lockKeyOf(key)
	ls := &lease{l: l, lock: lock, lockArg: lock}
	backoff := driver.Backoff{Min: 2 * time.Millisecond, Max: l.maxBackoff}
	// held says the last attempt found the lock held: the next ones probe
	// first, and the attempt reads each node's state before writing its
	// vote (see acquire.lua).
	held := false
	// clocks are the nodes' clocks as the probes last read them.
	var clocks []nodeClock
	// failed is the failure of the last attempt, while the attempts fail,
	// which a wait that ctx ends reports (see driver.Unreached).
	var failed error
	for {
		if held {
			// A waiter probes, writing nothing, and votes only once a
			// majority would grant the vote: its votes then never split
			// the nodes with a holder's own fresh attempt.
			if clocks == nil {
				clocks = make([]nodeClock, len(l.nodes))
			}
			hint, free, err := l.probeNodes(ctx, ls.lock, clocks)
			if ctxErr := ctx.Err(); ctxErr != nil {
				return nil, ctxErr
			}
			if err != nil {
				return nil, err
			}
			if !free {
				d := backoff.Next()
				if hint > 0 && hint < d {
					d = hint
				}
				if err := driver.Sleep(ctx, d, nil); err != nil {
					return nil, err
				}
				continue
			}
		}
		if err := l.awaitWithdrawals(ctx, ls.lock); err != nil {
			return nil, err
		}
		hint, err := l.try(ctx, ls, opts.TTL, held)
		if err == nil {
			return ls, nil
		}
		if opts.Wait && ctx.Err() != nil {
			if errors.Is(err, driver.ErrUnavailable) {
				failed = err
			}
			return nil, driver.Unreached(ctx, failed)
		}
		if !opts.Wait || errors.Is(err, errRefused) || !(errors.Is(err, driver.ErrNotAcquired) || errors.Is(err, driver.ErrUnavailable)) {
			return nil, err
		}
		held = errors.Is(err, driver.ErrNotAcquired)
		if failed = nil; !held {
			failed = err
		}
		d := backoff.Next()
		if hint > 0 && hint < d {
			d = hint
		}
		if err := driver.Sleep(ctx, d, nil); err != nil {
			return nil, driver.Unreached(ctx, failed)
		}
	}
}

// try makes one attempt. On failure it has withdrawn the owner's votes from
// every node that may hold one (including those whose answer it did not
// get), or, once ctx is done, left their withdrawal under way in the
// background, and returns how long the holder's votes still last, as a
// hint for the next attempt. It hands out no lease once ctx is done.
func (l *Locker) try(ctx context.Context, ls *lease, ttl time.Duration, held bool) (time.Duration, error) {
	ids, err := l.identify(ctx)
	if err != nil {
		return 0, err
	}
	// An owner id of its own for every attempt: a withdrawal of an earlier
	// attempt that is still under way on a slow node can then never remove
	// a vote this attempt counts. The calls of this attempt that may outlive
	// it read this variable, never ls.
	owner := rand.Text()
	ownerArg := any(owner)
	start := time.Now()
	proposal := l.propose(start)
	lock := ls.lock
	cmd := []any{"evalsha", l.acquireSha, 1, ls.lockArg, ownerArg, ttl.Milliseconds(), proposal, l.leadBound}
	if held {
		// Read the state before writing the vote (see acquire.lua).
		cmd = append(cmd, "1")
	}
	// Every answer is awaited, though a majority that granted the vote and
	// recorded the proposal settles the lease: a lease handed out before a
	// slow node's vote lands would be released before it too, and the
	// withdrawal would then have to wait for the vote, so that the next
	// acquisition would find that node still held and be refused there.
	votes := l.gather(ctx, func(ctx context.Context, i int) (any, error) {
		return evalsha(ctx, l.nodes[i], acquireSrc, cmd).Result()
	}, nil, nil, nil)
	var (
		granted  = make([]int, 0, len(l.nodes))
		mine     = make([]int, 0, len(l.nodes)) // nodes that may hold the owner's vote: granted, or no answer
		recorded int                            // granting nodes that recorded the proposal
		tooHigh  bool                           // a node found the proposal too far ahead of its clock
		maxFence int64                          // the highest fence among the granting nodes, now
		reported int64                          // the highest fence a node reported (see learn)
		failed   int
		hint     time.Duration
	)
	for i := range votes {
		// A node whose server is unknown may be another's under a
		// second address: its vote does not count.
		if ids.ids[i] == "" && votes[i].err == nil {
			votes[i].err = ids.errs[i]
		}
	}
	for i, v := range votes {
		l.silent[i].Store(v.err != nil)
		if v.err != nil {
			failed++
			mine = append(mine, i)
			continue
		}
		switch a := v.val.(type) {
		case int64:
			if a == 1 { // granted, the proposal recorded
				granted = append(granted, i)
				mine = append(mine, i)
				recorded++
				// Its fence is now the proposal, above
				// the one it had. Not learned from:
				// that would move the base on by 1µs
				// a round, ahead of the clocks.
				maxFence = max(maxFence, proposal)
			} else if p := time.Duration(-a) * time.Millisecond; p > 0 && (hint == 0 || p < hint) {
				hint = p
			}
		case string: // granted, the proposal not recorded: the node's fence
			f, err := strconv.ParseInt(a, 10, 64)
			if err != nil {
				failed++
				mine = append(mine, i)
				continue
			}
			granted = append(granted, i)
			mine = append(mine, i)
			maxFence = max(maxFence, f)
			reported = max(reported, f)
			if f < proposal {
				tooHigh = true
			}
		default:
			failed++
			mine = append(mine, i)
		}
	}
	l.learn(start, reported, tooHigh)
	fail := func(err error) (time.Duration, error) {
		l.withdraw(ctx, ls.lockArg, ownerArg, "0", "0", mine, nil)
		if ctxErr := ctx.Err(); ctxErr != nil {
			return 0, ctxErr
		}
		return hint, err
	}
	if len(granted) < l.quorum {
		if n, err := refusals(votes); n > len(l.nodes)-l.quorum {
			return fail(fmt.Errorf("%w (%d of %d): %w", errRefused, n, len(l.nodes), err))
		}
		return fail(l.shortfall(failed, firstErr(votes)))
	}
	token := proposal
	if recorded < l.quorum {
		// Too few nodes recorded the proposal. The token then goes above
		// every fence in this majority, and is written back to all of it
		// before the lease is handed out: any later majority shares a node
		// with this one and reads a fence at least this high.
		token = maxFence + 1
		written := l.gather(ctx, func(ctx context.Context, i int) (any, error) {
			return l.fence.Run(ctx, l.nodes[i], []string{lock}, owner, token).Int64()
		}, ones, granted, nil)
		ok, unwritten := count(written)
		if ok < l.quorum {
			return fail(l.shortfall(failed+unwritten, firstErr(written)))
		}
	}
	expiry := l.expiry(ttl, start)
	if !time.Now().Before(expiry) {
		return fail(fmt.Errorf("%w: acquiring took longer than the TTL %v", driver.ErrNotAcquired, ttl))
	}
	if err := ctx.Err(); err != nil {
		// The caller has stopped waiting: a lease handed out now would
		// be nobody's, held until its TTL. Its votes are withdrawn.
		return fail(err)
	}
	ls.owner = ownerArg
	ls.token = uint64(token)
	ls.day = expiryDay(time.Now(), ttl)
	ls.votes, ls.counted = mine, mine
	if unknown := slices.ContainsFunc(mine, func(i int) bool { return ids.ids[i] == "" }); unknown {
		ls.counted = slices.DeleteFunc(slices.Clone(mine), func(i int) bool { return ids.ids[i] == "" })
	}
	ls.setExpiry(expiry)
	return 0, nil
}

// answered judges a Ping: pro when the node answered.
func answered(r result) verdict {
	if r.err == nil {
		return pro
	}
	return unsettled
}

// expiryDay is the day (since the epoch) at whose end a vote's key expires
// when the vote was granted about now for ttl, as acquire.lua works it out
// on the node's clock. The release sends it back so that the node need not
// rewrite its state, and a node that set another day (a clock apart from
// ours by a day's boundary) only costs that rewrite.
func expiryDay(now time.Time, ttl time.Duration) int64 {
	const day = 24 * time.Hour
	return (now.UnixMilli()+ttl.Milliseconds())/day.Milliseconds() + 2
}

// propose is the token to propose in a round sent at sent: the highest
// fence the nodes reported so far, moved on by the local time elapsed since
// the round that read it was sent. Fences follow the nodes' clocks, and the
// base keeps the slowest answer's latency, so this is usually above every
// node's fence and the round needs no second step to write its token back.
// Only the local monotonic clock is read, never the wall clock: a wrong
// guess costs that second step, never safety, since nodes record only
// proposals above their fence. It is 0 (recorded nowhere) until a node has
// reported a fence.
func (l *Locker) propose(sent time.Time) int64 {
	base := l.fenceBase.Load()
	if base == 0 {
		return 0
	}
	return base + sent.Sub(epoch).Microseconds() + 1
}

// learn moves the base of proposals to the highest fence the nodes reported
// to a round sent at sent. The base only rises, unless a node found the
// proposal too far ahead of its clock: the base is then this round's.
func (l *Locker) learn(sent time.Time, fence int64, tooHigh bool) {
	if fence <= 0 {
		return
	}
	base := fence - sent.Sub(epoch).Microseconds()
	if tooHigh {
		l.fenceBase.Store(base)
		return
	}
	for {
		cur := l.fenceBase.Load()
		if base <= cur || l.fenceBase.CompareAndSwap(cur, base) {
			return
		}
	}
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

// withdraw removes owner's votes from lock (lockKeyOf; both as the scripts
// take them, see lease) on the nodes which (their indexes into l.nodes),
// whatever ctx's state: a node may have granted a vote whose answer was
// lost. token and day are what the votes recorded, as a rule ("0" when
// unknown): a node where they differ costs one more command. The requests
// are bounded by the node timeout alone, ctx's end cancelling none of
// them, but the wait for their answers ends with ctx: the others finish in
// the background, so that the votes are withdrawn as surely as when the
// caller waits. With judge it returns as soon as the answers settle a
// majority (see gather); otherwise it waits for every answer, the node
// timeout or ctx's end.
//
// A withdrawal that ctx's end leaves under way is recorded until it is
// over (see awaitWithdrawals), so that the Locker's next attempt on the
// lock does not find its own votes still there, and take the lock for
// held.
func (l *Locker) withdraw(ctx context.Context, lock, owner, token, day any, which []int, judge func(result) verdict) []result {
	if len(which) == 0 {
		return nil
	}
	cmd := []any{"evalsha", l.releaseSha, 1, lock, owner, token, day}
	rs, over := l.round(context.WithoutCancel(ctx), func(ctx context.Context, i int) (any, error) {
		return evalshaOnce(ctx, l.nodes[i], releaseSrc, cmd).Int64()
	}, judge, which, ctx.Done())
	if ctx.Err() != nil {
		l.recordWithdrawal(lock, over)
	}
	return rs
}

// recordWithdrawal records over, the end of a withdrawal from lock under
// way, until it comes, joined with the end of any other recorded for lock
// (two goroutines of the Locker on one key), within the node timeout.
func (l *Locker) recordWithdrawal(lock any, over <-chan struct{}) {
	for {
		prev, taken := l.withdrawing.LoadOrStore(lock, over)
		if !taken {
			break
		}
		both, other, mine := make(chan struct{}), prev.(<-chan struct{}), over
		go func() {
			<-other
			<-mine
			close(both)
		}()
		if l.withdrawing.CompareAndSwap(lock, prev, (<-chan struct{})(both)) {
			over = both
			break
		}
	}
	go func(over <-chan struct{}) {
		<-over
		l.withdrawing.CompareAndDelete(lock, over)
	}(over)
}

// awaitWithdrawals waits, until ctx is done, for the withdrawals from lock
// that their callers' contexts left under way (see withdraw), which end
// within the node timeout.
func (l *Locker) awaitWithdrawals(ctx context.Context, lock string) error {
	over, ok := l.withdrawing.Load(lock)
	if !ok {
		return nil
	}
	select {
	case <-over.(<-chan struct{}):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// evalsha runs a script on node by its digest, as go-redis's Script.Run
// does, but on a command built once for all the nodes of a round:
// "evalsha", the digest, 1, the key, the arguments. Script.Run converts the
// key and the arguments to interface values and makes the command's slice
// for every node, a dozen allocations a node. The calls to the nodes share
// cmd, in parallel, so they only read it: on NOSCRIPT (a restarted node,
// SCRIPT FLUSH) the body goes in a copy.
func evalsha(ctx context.Context, node goredis.UniversalClient, src string, cmd []any) *goredis.Cmd {
	return run(ctx, node, src, cmd, rediseval.Eval)
}

// evalshaOnce is evalsha for a withdrawal, which go-redis must not send
// again after an error that leaves its outcome unknown (an answer later
// than the client's read timeout but within the node timeout, a connection
// broken after the write; see rediseval.EvalOnce): sent again, it finds the
// vote withdrawn by the first and answers that it was not held, and a
// majority of such answers made the release ErrNotHeld, which guard takes
// for a lock lost during the section. Sent once, it fails as a node that
// did not answer.
func evalshaOnce(ctx context.Context, node goredis.UniversalClient, src string, cmd []any) *goredis.Cmd {
	return run(ctx, node, src, cmd, rediseval.EvalOnce)
}

func run(ctx context.Context, node goredis.UniversalClient, src string, cmd []any, eval func(context.Context, rediseval.Client, ...any) *goredis.Cmd) *goredis.Cmd {
	c := eval(ctx, node, cmd...)
	// HasErrorPrefix allocates even for no error.
	if err := c.Err(); err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		full := slices.Clone(cmd)
		full[0], full[1] = "eval", src
		c = eval(ctx, node, full...)
	}
	return c
}

type result struct {
	val any
	err error
	// late: the node had not answered when its round returned.
	late bool
}

// verdict is what one node's answer says of its round's majority (see
// gather).
type verdict int8

const (
	unsettled verdict = iota // an error, or an answer that settles nothing alone
	pro                      // counts toward the majority
	con                      // rules its node out of the majority
)

// ones judges the answers of owner-checked scripts: 1 for the owner's vote,
// 0 for none.
func ones(r result) verdict {
	switch {
	case r.err != nil:
		return unsettled
	case r.val.(int64) == 1:
		return pro
	}
	return con
}

// gather calls f on the nodes which (their indexes into l.nodes; all of
// them when nil) in parallel, under one context for the whole round: ctx,
// bounded by the node timeout. A node that does not answer in time, or
// before stop is closed (nil for none), counts as failed, even if its
// client ignores the context's deadline: its call finishes in the
// background. Without judge it waits for every answer; with judge it
// returns once the answers settle the round: a majority of the nodes
// judged pro, or more than len(which) less a majority judged con, so that
// no majority can be had. The nodes that have not answered by then count
// as failed, and their calls finish in the background. It thus returns
// once ctx is done or stop is closed, whatever the calls do: what makes
// the Locker driver.ContextBounded.
func (l *Locker) gather(ctx context.Context, f func(context.Context, int) (any, error), judge func(result) verdict, which []int, stop <-chan struct{}) []result {
	rs, _ := l.round(ctx, f, judge, which, stop)
	return rs
}

// round is gather, which also returns a channel closed once the round is
// over: its last call returned, or the node timeout passed (a call to a
// silent node, which its client may hold for its own read timeout or for
// ever, counts as failed from then on), whichever came first.
func (l *Locker) round(ctx context.Context, f func(context.Context, int) (any, error), judge func(result) verdict, which []int, stop <-chan struct{}) ([]result, <-chan struct{}) {
	if which == nil {
		which = l.all
	}
	type answer struct {
		j int
		result
	}
	// One context and one timer for the round, not one a node: the calls
	// start together and share their deadline. The last of the calls and
	// this gatherer to finish releases it: released earlier, it would end
	// the wait below before the answers already sent were read.
	rctx, cancel := context.WithTimeout(ctx, l.nodeTimeout)
	fl := &flight{cancel: cancel}
	fl.left.Store(int32(len(which)) + 1)
	defer fl.finished()
	answers := make(chan answer, len(which))
	for j, i := range which {
		go func() {
			v, err := f(rctx, i)
			answers <- answer{j, result{val: v, err: err}}
			fl.finished()
		}()
	}
	out := make([]result, len(which))
	for j := range out {
		out[j].late = true
	}
	var yes, no int
	for range which {
		select {
		case a := <-answers:
			out[a.j] = a.result
			if judge == nil {
				continue
			}
			switch judge(a.result) {
			case pro:
				yes++
			case con:
				no++
			}
			if yes < l.quorum && no <= len(which)-l.quorum {
				continue
			}
		case <-rctx.Done():
		case <-stop:
		}
		break
	}
	for j := range out {
		if out[j].late {
			out[j].err = noAnswer(which[j])
		}
	}
	return out, rctx.Done()
}

// noAnswer is the error of a node, by its index, whose answer its round did
// not get: not within the node timeout, not before the caller's context
// ended, or not before the others settled the round. An integer, so that
// it allocates nothing.
type noAnswer int

func (n noAnswer) Error() string {
	return fmt.Sprintf("node %d: no answer within the node timeout, before the context ended, or before a majority settled the round", int(n))
}

// flight is what a round's calls share while they run.
type flight struct {
	left   atomic.Int32
	cancel context.CancelFunc
}

// finished counts one call, or the gatherer, out; the last releases the
// round's context.
func (fl *flight) finished() {
	if fl.left.Add(-1) == 0 {
		fl.cancel()
	}
}

// errRefused: so many nodes refused a vote for good (an ACL without the
// scripts or the key, EVALSHA renamed away; see
// redisrefusal) that no majority can grant it until an operator steps in.
// A waiting Acquire returns it at once.
var errRefused = fmt.Errorf("%w: nodes refused the vote for good", driver.ErrUnavailable)

// refusals counts the results that are refusals only an operator mends,
// and returns the first.
func refusals(rs []result) (n int, first error) {
	for _, r := range rs {
		if r.err != nil && redisrefusal.Permanent(r.err) {
			if n++; n == 1 {
				first = r.err
			}
		}
	}
	return n, first
}

func firstErr(rs []result) error {
	for _, r := range rs {
		if r.err != nil {
			return r.err
		}
	}
	return errors.New("no error")
}

// lockKeyOf names the key of key's vote, and fence, on every node, in a
// hash tag of its own.
func lockKeyOf(key string) string { return "{" + redistag.Escape(key) + "}:lock" }

// Ping implements driver.Pinger: nil when a majority of the nodes answer
// PING within the node timeout and told their server (INFO), which is what
// a lock needs, and an error wrapping driver.ErrInvalidOption when two
// nodes are one server (see identify). When it reads the nodes'
// identities, it waits for every node, within the node timeout.
func (l *Locker) Ping(ctx context.Context) error {
	ids, err := l.identify(ctx)
	if err != nil {
		return err
	}
	rs := l.gather(ctx, func(ctx context.Context, i int) (any, error) {
		return nil, l.nodes[i].Ping(ctx).Err()
	}, answered, nil, nil)
	up := 0
	for _, r := range rs {
		if r.err == nil {
			up++
		}
	}
	if up < l.quorum {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%w: redlock: %d of %d nodes answered, %d needed: %w", driver.ErrUnavailable, up, len(l.nodes), l.quorum, firstErr(rs))
	}
	// A node whose server is unknown casts no vote that counts (see
	// identify), so a majority of them cannot grant a lock, however well
	// they answer PING.
	known := 0
	for _, id := range ids.ids {
		if id != "" {
			known++
		}
	}
	if known < l.quorum {
		return fmt.Errorf("%w: redlock: the servers of %d of %d nodes are known (INFO server), %d needed: %w",
			driver.ErrUnavailable, known, len(l.nodes), l.quorum, errors.Join(ids.errs...))
	}
	return nil
}

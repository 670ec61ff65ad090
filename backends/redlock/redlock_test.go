package redlock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

const addrsEnv = "WARDEN_REDLOCK_ADDRS"
const addrsDefault = "127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384"

// clients connects to addrs, as a separate process would.
func clients(t testing.TB, addrs []string, tweak func(*goredis.Options)) []goredis.UniversalClient {
	t.Helper()
	out := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		o := &goredis.Options{Addr: a, MaxRetries: -1, ContextTimeoutEnabled: true}
		if tweak != nil {
			tweak(o)
		}
		c := goredis.NewClient(o)
		t.Cleanup(func() { c.Close() })
		out[i] = c
	}
	return out
}

func sharedLocker(t testing.TB, opts ...Option) *Locker {
	t.Helper()
	v := drivertest.Addr(t, addrsEnv, addrsDefault)
	addrs := strings.Split(v, ",")
	for _, a := range addrs[1:] { // Addr checked only the first
		drivertest.Addr(t, addrsEnv, a)
	}
	l, err := New(clients(t, addrs, nil), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestConformance(t *testing.T) {
	// The node timeout must be far below the TTL, and long enough for a
	// loaded machine running the race detector to answer within it.
	drivertest.Run(t, drivertest.Backend{
		NewLocker: func(t testing.TB) driver.Locker { return sharedLocker(t, WithNodeTimeout(250*time.Millisecond)) },
		TTL:       time.Second,
		// Every node goes silent, with a node timeout the calls'
		// contexts end before.
		Silence: func(t testing.TB) (driver.Locker, func()) {
			nodes, proxies := proxiedNodes(t)
			l, err := New(nodes, WithNodeTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			return l, func() {
				for _, p := range proxies {
					p.Blackhole()
				}
			}
		},
	})
}

func TestNewRejectsEvenOrFewNodes(t *testing.T) {
	for _, n := range []int{0, 1, 2, 4} {
		if _, err := New(make([]goredis.UniversalClient, n)); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("New with %d nodes: got %v, want ErrInvalidOption", n, err)
		}
	}
}

// TestNewRejectsANodeListedTwice: one client listed twice casts two votes,
// so a minority of the servers makes a majority of the nodes, and one
// server's restart without persistence loses the lock: New refuses it.
func TestNewRejectsANodeListedTwice(t *testing.T) {
	a := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	b := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:2"})
	again := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	for _, c := range []*goredis.Client{a, b, again} {
		t.Cleanup(func() { c.Close() })
	}
	if _, err := New([]goredis.UniversalClient{a, b, a}); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("one client twice: got %v, want ErrInvalidOption", err)
	}
	// A cluster client's INFO goes to any of its servers: its identity
	// cannot be read, and its votes would be counted blind.
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { cluster.Close() })
	if _, err := New([]goredis.UniversalClient{a, b, cluster}); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("a cluster client as a node: got %v, want ErrInvalidOption", err)
	}
	// Two clients of one address are found on first use, by the server's
	// identity (TestOneServerUnderTwoAddresses): an address alone cannot
	// tell (TestNewTakesClientsWithDialers).
	if _, err := New([]goredis.UniversalClient{a, b, again}); err != nil {
		t.Errorf("two clients of one address: New got %v, want nil", err)
	}
}

// TestNewRejectsANilClient: a nil *goredis.Client in the list is not a nil
// interface, and the first request to it panicked on a goroutine of the
// Locker's own, which took the process down. New refuses it.
func TestNewRejectsANilClient(t *testing.T) {
	a := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	b := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:2"})
	for _, c := range []*goredis.Client{a, b} {
		t.Cleanup(func() { c.Close() })
	}
	var none *goredis.Client
	if _, err := New([]goredis.UniversalClient{a, none, b}); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("a nil *goredis.Client: got %v, want ErrInvalidOption", err)
	}
}

// Clients that reach their servers through a Dialer of their own name no
// address (go-redis fills in localhost:6379 for each): New takes them as
// distinct, and the first acquisition tells their servers apart by their
// identity. New refused them as one server.
func TestNewTakesClientsWithDialers(t *testing.T) {
	addrs := strings.Split(drivertest.Addr(t, addrsEnv, addrsDefault), ",")
	nodes := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		var d net.Dialer
		c := goredis.NewClient(&goredis.Options{
			Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", a)
			},
			MaxRetries: -1, ContextTimeoutEnabled: true,
		})
		t.Cleanup(func() { c.Close() })
		nodes[i] = c
	}
	l, err := New(nodes)
	if err != nil {
		t.Fatalf("New of clients with their own dialers: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, "dialers-"+strconv.FormatInt(time.Now().UnixNano(), 36), driver.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire through them: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// startServers starts n redis-servers of the test's own, for faults
// (killing, freezing, restarting empty) the shared servers must not see.
func startServers(t *testing.T, n int) []*drivertest.RedisServer {
	t.Helper()
	servers := make([]*drivertest.RedisServer, n)
	for i := range servers {
		servers[i] = drivertest.StartRedis(t)
	}
	return servers
}

func privateLocker(t *testing.T, servers []*drivertest.RedisServer, tweak func(*goredis.Options), opts ...Option) *Locker {
	t.Helper()
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr()
	}
	l, err := New(clients(t, addrs, tweak), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestMinorityDown: with 2 of 5 nodes killed a majority remains and the lock
// works, tokens still increasing; with 3 killed no majority is possible and
// Acquire reports the backend unavailable.
func TestMinorityDown(t *testing.T) {
	servers := startServers(t, 5)
	l := privateLocker(t, servers, nil, WithNodeTimeout(200*time.Millisecond))
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 5 * time.Second}
	first, err := l.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatalf("all nodes up: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Release returned once a majority withdrew the votes; the other
	// withdrawals may still be on their way, and the two nodes killed next
	// may be two of that majority.
	awaitWithdrawn(t, l, "k")
	servers[0].Kill(t)
	servers[3].Kill(t)
	lease, err := l.Acquire(ctx, "k", opts)
	if err != nil {
		t.Fatalf("2 of 5 nodes down: %v", err)
	}
	if lease.Token() <= first.Token() {
		t.Errorf("token %d after %d", lease.Token(), first.Token())
	}
	other, _ := New(l.nodes, WithNodeTimeout(200*time.Millisecond))
	if _, err := other.Acquire(ctx, "k", opts); !errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("second holder with 2 nodes down: got %v, want ErrNotAcquired", err)
	}
	if err := lease.Refresh(ctx, opts.TTL); err != nil {
		t.Errorf("Refresh with 2 of 5 nodes down: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release with 2 of 5 nodes down: %v", err)
	}
	// The third node frozen rather than killed, so that it can come back.
	servers[4].Signal(t, syscall.SIGSTOP)
	if lease, err := l.Acquire(ctx, "k", opts); !errors.Is(err, driver.ErrUnavailable) {
		if err == nil {
			lease.Release(ctx)
		}
		t.Fatalf("3 of 5 nodes down: got %v, want ErrUnavailable", err)
	}
	// A waiting Acquire goes on through the outage until its own bound.
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := l.Acquire(wctx, "k", driver.AcquireOptions{TTL: opts.TTL, Wait: true}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting Acquire with 3 of 5 nodes down: got %v, want its context's deadline", err)
	}
	// And gets the lock once a majority is back.
	servers[4].Signal(t, syscall.SIGCONT)
	wctx, cancel = context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lease, err = l.Acquire(wctx, "k", driver.AcquireOptions{TTL: opts.TTL, Wait: true})
	if err != nil {
		t.Fatalf("waiting Acquire once 3 of 5 nodes are back: %v", err)
	}
	lease.Release(ctx)
}

// TestLongWait waits for a lock longer than any growing backoff could before
// it overflowed (it once crashed the process after about 7s): the pauses stay
// bounded, and the waiter gets the lock once it is released; a waiter whose
// deadline comes first gets its context's error.
func TestLongWait(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 9s")
	}
	holder, waiter := sharedLocker(t, WithNodeTimeout(250*time.Millisecond)), sharedLocker(t, WithNodeTimeout(250*time.Millisecond))
	ctx := context.Background()
	key := fmt.Sprintf("long-wait/%d", time.Now().UnixNano())
	ttl := 2 * time.Second
	held, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	// Keep the holder alive for 9s, as guard's keeper would.
	stop := make(chan struct{})
	refreshed := make(chan error, 1)
	go func() {
		tick := time.NewTicker(ttl / 4)
		defer tick.Stop()
		deadline := time.After(9 * time.Second)
		for {
			select {
			case <-tick.C:
				if err := held.Refresh(ctx, ttl); err != nil {
					refreshed <- err
					return
				}
			case <-deadline:
				refreshed <- held.Release(ctx)
				return
			case <-stop:
				refreshed <- nil
				return
			}
		}
	}()
	defer close(stop)

	short, cancel := context.WithTimeout(ctx, 8500*time.Millisecond)
	defer cancel()
	if _, err := waiter.Acquire(short, key, driver.AcquireOptions{TTL: ttl, Wait: true}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiter with an 8.5s bound on a lock held for 9s: %v, want its context's deadline", err)
	}
	long, cancel2 := context.WithTimeout(ctx, time.Minute)
	defer cancel2()
	lease, err := waiter.Acquire(long, key, driver.AcquireOptions{TTL: ttl, Wait: true})
	if err != nil {
		t.Fatalf("the waiter after the holder released: %v", err)
	}
	if err := <-refreshed; err != nil {
		t.Fatalf("the holder: %v", err)
	}
	if lease.Token() <= held.Token() {
		t.Errorf("token %d after %d", lease.Token(), held.Token())
	}
	lease.Release(ctx)
}

func TestExpiryBoundsTheVotes(t *testing.T) {
	l := sharedLocker(t)
	ctx := context.Background()
	ttl := 3 * time.Second
	before := time.Now()
	lease, err := l.Acquire(ctx, fmt.Sprintf("expiry/%d", time.Now().UnixNano()), driver.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	drift := time.Duration(float64(ttl)*0.01) + 2*time.Millisecond
	if e := lease.Expiry(); e.After(time.Now().Add(ttl-drift)) || e.Before(before.Add(ttl-drift)) {
		t.Errorf("Expiry %v after acquiring: want the round's start + ttl - drift (%v)", e.Sub(before), ttl-drift)
	}
	beforeRefresh := time.Now()
	if err := lease.Refresh(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	if e := lease.Expiry(); e.Before(beforeRefresh.Add(ttl - drift)) {
		t.Errorf("Expiry after a refresh: %v, want at least the refresh's start + ttl - drift", e.Sub(beforeRefresh))
	}
}

func TestLimits(t *testing.T) {
	l := sharedLocker(t, WithNodeTimeout(100*time.Millisecond))
	if got := l.Limits(); got.MinTTL != MinTTLFactor*100*time.Millisecond || got.TTLStep != time.Millisecond {
		t.Errorf("Limits %+v", got)
	}
	for _, o := range []Option{WithNodeTimeout(0), WithDriftFactor(0.5), WithMaxBackoff(0)} {
		if _, err := New(l.nodes, o); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("a bad option: %v, want ErrInvalidOption", err)
		}
	}
	if _, err := New([]goredis.UniversalClient{l.nodes[0], nil, l.nodes[2]}); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("a nil node: %v, want ErrInvalidOption", err)
	}
}

// TestTokensGrowAfterNodesForget: every node restarts without persistence,
// forgetting its fence; tokens issued afterwards are still greater than
// every token issued before.
func TestTokensGrowAfterNodesForget(t *testing.T) {
	servers := startServers(t, 3)
	grant := func() uint64 {
		t.Helper()
		// A node timeout that a loaded machine's latency does not reach.
		l := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
		lease, err := l.Acquire(context.Background(), "k", driver.AcquireOptions{TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		return lease.Token()
	}
	var last uint64
	for range 5 {
		last = grant()
	}
	for _, s := range servers {
		s.Restart(t)
	}
	if next := grant(); next <= last {
		t.Fatalf("token %d after the nodes restarted empty, not greater than %d before", next, last)
	}
}

// counter counts the scripts its clients run by their digests, and those
// they send in full (EVAL, after NOSCRIPT), by SHA1, ignoring the commands
// that set up connections.
type counter struct {
	mu   sync.Mutex
	n    map[string]int
	full map[string]int
}

func (c *counter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *counter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		switch cmd.Name() {
		case "evalsha":
			c.mu.Lock()
			c.n[fmt.Sprint(cmd.Args()[1])]++
			c.mu.Unlock()
		case "eval":
			sum := sha1.Sum([]byte(fmt.Sprint(cmd.Args()[1])))
			c.mu.Lock()
			c.full[hex.EncodeToString(sum[:])]++
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// runs is how often the script ran since the last reset, which it does.
func (c *counter) runs(s *goredis.Script) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[s.Hash()]
}

// sent is how often the script was sent in full since the last reset.
func (c *counter) sent(s *goredis.Script) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.full[s.Hash()]
}

func (c *counter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n, c.full = map[string]int{}, map[string]int{}
}

// countedLocker is a Locker on the shared nodes whose scripts c counts.
func countedLocker(t *testing.T, c *counter, opts ...Option) *Locker {
	t.Helper()
	c.reset()
	l := sharedLocker(t, opts...)
	for _, n := range l.nodes {
		n.AddHook(c)
	}
	return l
}

// awaitWithdrawn waits until no node holds a vote for key, as after a
// release whose background withdrawals have all landed.
func awaitWithdrawn(t *testing.T, l *Locker, key string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for i, n := range l.nodes {
		for {
			v, err := n.Get(ctx, lockKeyOf(key)).Result()
			if err != nil && !errors.Is(err, goredis.Nil) {
				t.Fatalf("node %d: %v", i, err)
			}
			if strings.HasPrefix(v, "0:") || errors.Is(err, goredis.Nil) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d still holds a vote 5s after the release: %q", i, v)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// TestOneRoundPerStep: once a Locker has heard the nodes' fences, an
// acquisition is one script per node, its token recorded in the same step
// (no second round writes it back), and a release at most one more; tokens
// still increase.
func TestOneRoundPerStep(t *testing.T) {
	var c counter
	// A node timeout that a loaded machine's latency does not reach: an
	// answer lost to it would be a vote to withdraw, not a protocol step.
	l := countedLocker(t, &c, WithNodeTimeout(time.Second))
	ctx := context.Background()
	key := fmt.Sprintf("one-round/%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 5 * time.Second}
	var last uint64
	cycle := func() {
		t.Helper()
		lease, err := l.Acquire(ctx, key, opts)
		if err != nil {
			t.Fatal(err)
		}
		if lease.Token() <= last {
			t.Fatalf("token %d after %d", lease.Token(), last)
		}
		last = lease.Token()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // learns the fences
	awaitWithdrawn(t, l, key)
	// The proposals lead the nodes' clocks by the latency of the round the
	// Locker learned from; a round whose calls take longer to reach a
	// node than that one's finds the proposal behind the node's clock and
	// needs the second round, by design. Under load the latency varies by
	// far more than an idle round's, so the lead is made half the node
	// timeout, within the bound on it (see acquire.lua).
	l.fenceBase.Add(l.nodeTimeout.Microseconds() / 2)
	c.reset()
	const cycles = 5
	for range cycles {
		cycle()
	}
	// Every call a release left in the background has reached its node.
	awaitWithdrawn(t, l, key)
	if got, want := c.runs(l.acquire), cycles*len(l.nodes); got != want {
		t.Errorf("%d acquiring scripts for %d cycles on %d nodes, want %d", got, cycles, len(l.nodes), want)
	}
	if got := c.runs(l.fence); got != 0 {
		t.Errorf("%d fence scripts: tokens were written back in a second round", got)
	}
	if got, most := c.runs(l.release), cycles*len(l.nodes); got > most {
		t.Errorf("%d releasing scripts for %d cycles on %d nodes, want at most %d", got, cycles, len(l.nodes), most)
	}
}

// TestRefusingNodesAreLeftAlone: an attempt that every node refuses (the lock
// is another owner's) withdraws nothing, since a refusing node cannot hold
// the attempt's vote.
func TestRefusingNodesAreLeftAlone(t *testing.T) {
	ctx := context.Background()
	key := fmt.Sprintf("refused/%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 5 * time.Second}
	held, err := sharedLocker(t).Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	var c counter
	l := countedLocker(t, &c)
	if _, err := l.Acquire(ctx, key, opts); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("got %v, want ErrNotAcquired", err)
	}
	if got := c.runs(l.acquire); got != len(l.nodes) {
		t.Errorf("%d acquiring scripts, want one per node", got)
	}
	if got := c.runs(l.release); got != 0 {
		t.Errorf("%d withdrawals after an attempt every node refused, want none", got)
	}
}

// TestOwnVoteCounts: a node that already holds the owner's vote (the call
// was sent again after its answer was lost) grants it again with a fresh TTL
// instead of refusing it, so that a refusal always means another owner's
// vote.
func TestOwnVoteCounts(t *testing.T) {
	l := sharedLocker(t)
	ctx := context.Background()
	key := fmt.Sprintf("own-vote/%d", time.Now().UnixNano())
	lock := lockKeyOf(key)
	n := l.nodes[0]
	defer n.Del(ctx, lock)
	// The vote's answer: 1 or the node's fence (digits) when granted, 0
	// less the holder's pttl when refused.
	run := func(owner string, ttl int64) any {
		t.Helper()
		v, err := l.acquire.Run(ctx, n, []string{lock}, owner, ttl, 0, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v, ok := run("a", 1000).(string); !ok {
		t.Fatalf("free lock: %v, want granted with the node's fence", v)
	}
	if v, ok := run("a", 5000).(string); !ok {
		t.Fatalf("own vote: %v, want granted again", v)
	}
	if v, ok := run("b", 1000).(int64); !ok || v >= -1000 {
		t.Fatalf("another owner's vote: %v, want refused with about 5000ms left", v)
	}
}

// TestTokensIncreaseWhateverTheProposals: Lockers whose proposals are far
// ahead of the nodes' clocks or far behind their fences still hand out
// increasing tokens (through the second round), and a proposal too far
// ahead is not recorded, so tokens do not leap.
func TestTokensIncreaseWhateverTheProposals(t *testing.T) {
	ctx := context.Background()
	key := fmt.Sprintf("proposals/%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 5 * time.Second}
	fresh, ahead, behind := sharedLocker(t), sharedLocker(t), sharedLocker(t)
	lease, err := fresh.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	last := lease.Token()
	lease.Release(ctx)
	const hour = int64(time.Hour / time.Microsecond)
	for round := range 3 {
		if round < 2 {
			ahead.fenceBase.Store(fresh.fenceBase.Load() + hour)
			behind.fenceBase.Store(fresh.fenceBase.Load() - hour)
		}
		for name, l := range map[string]*Locker{"fresh": fresh, "ahead": ahead, "behind": behind} {
			lease, err := l.Acquire(ctx, key, opts)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if lease.Token() <= last {
				t.Fatalf("round %d, %s: token %d after %d", round, name, lease.Token(), last)
			}
			if lease.Token() > last+uint64(time.Minute/time.Microsecond) {
				t.Errorf("round %d, %s: token %d leapt from %d", round, name, lease.Token(), last)
			}
			last = lease.Token()
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := ahead.fenceBase.Load(); got > fresh.fenceBase.Load()+hour/2 {
		t.Errorf("a base found too far ahead stayed there")
	}
}

// TestFencesExpire: the fence a lock leaves on the nodes, its vote's key,
// expires one to two days later, so that lock names used once do not stay on
// the nodes for ever (a token never rests on an expired fence: every fence
// is close to its node's clock when written, and the clock a day later is
// past it). Every node that voted ends with its vote withdrawn; the
// token is the fence of a majority (a node whose vote was answered too late
// for the round keeps the lower token it proposed, which a later token,
// drawn from a majority's fences, passes all the same).
func TestFencesExpire(t *testing.T) {
	v := drivertest.Addr(t, addrsEnv, addrsDefault)
	addrs := strings.Split(v, ",")
	l := sharedLocker(t, WithNodeTimeout(250*time.Millisecond))
	ctx := context.Background()
	key := "fence-expiry-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	awaitWithdrawn(t, l, key)
	fence := lockKeyOf(key)
	recorded := 0
	for _, c := range clients(t, addrs, nil) {
		v, err := c.Get(ctx, fence).Result()
		if errors.Is(err, goredis.Nil) {
			continue // a node that did not vote
		}
		pttl, err := c.PTTL(ctx, fence).Result()
		if err != nil {
			t.Fatal(err)
		}
		c.Del(ctx, fence)
		if pttl < 23*time.Hour || pttl > 48*time.Hour {
			t.Fatalf("a fence's PTTL after a grant: %v, want one to two days", pttl)
		}
		f, ok := strings.CutPrefix(v, "0:")
		if f, _, _ = strings.Cut(f, ":"); !ok {
			t.Fatalf("a node's vote after the release: %q, want it withdrawn", v)
		}
		switch n, err := strconv.ParseUint(f, 10, 64); {
		case err != nil || n > lease.Token():
			t.Fatalf("a node's fence after the release: %q, want at most the token %d", v, lease.Token())
		case n == lease.Token():
			recorded++
		}
	}
	if recorded < len(addrs)/2+1 {
		t.Fatalf("the token was recorded on %d of %d nodes, want a majority", recorded, len(addrs))
	}
}

// TestProbeState: a probe reads a withdrawn or lapsed vote as free, and a
// live one as held for what is left of it; a value it cannot read as held,
// with no hint.
func TestProbeState(t *testing.T) {
	const now = 1_800_000_000_000
	for _, c := range []struct {
		v    string
		want int64
	}{
		{"0:1799999999000123:20834:", 1},
		{"1800000000250:1799999999000123:20834:owner", -250},
		{"1800000000000:1799999999000123:20834:owner", 1},
		{"1799999999000:1799999999000123:20834:owner", 1},
		{"1800000000250:1799999999000123:20834:own:er", -250},
		{"an earlier format", 0},
		{"x:1:2:owner", 0},
	} {
		if got := probeState(c.v, now); got != c.want {
			t.Errorf("probeState(%q) = %d, want %d", c.v, got, c.want)
		}
	}
}

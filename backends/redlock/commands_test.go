package redlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// calls sums the calls of every command in the INFO commandstats of the
// servers, the commands scripts run included, the INFO calls excepted.
func calls(t *testing.T, servers []*drivertest.RedisServer) int64 {
	t.Helper()
	var total int64
	for _, n := range callsByName(t, servers) {
		total += n
	}
	return total
}

// callsByName is calls by command name.
func callsByName(t testing.TB, servers []*drivertest.RedisServer) map[string]int64 {
	t.Helper()
	by := map[string]int64{}
	for _, s := range servers {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		info, err := c.Info(context.Background(), "commandstats").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
				continue
			}
			for f := range strings.SplitSeq(stats, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					by[strings.TrimPrefix(name, "cmdstat_")] += n
				}
			}
		}
	}
	return by
}

// waitRefused runs a waiting Acquire of key on waiter, which must not get
// it, until attempts (of the servers' counts) reaches enough, however slowly
// a loaded machine lets it (failing the test after 20s), then ends it.
func waitRefused(t *testing.T, waiter *Locker, key string, servers []*drivertest.RedisServer, attempts func(map[string]int64) int64, enough int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, key, driver.AcquireOptions{TTL: 30 * time.Second, Wait: true})
		done <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for attempts(callsByName(t, servers)) < enough {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("fewer than %d attempts in 20s with pauses of 5ms at most", enough)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("acquired a lock held on a majority")
	}
}

// TestUncontendedCycleCommands: once a Locker has heard the nodes' fences,
// an uncontended acquisition and release cost 5 server commands a node
// (the vote: EVALSHA, TIME, SET; the withdrawal: EVALSHA, SET), counted by
// the servers themselves.
func TestUncontendedCycleCommands(t *testing.T) {
	servers := startServers(t, 3)
	l := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	ctx := context.Background()
	cycle := func() {
		lease, err := l.Acquire(ctx, "cycle", driver.AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // the Locker learns the fences
	cycle()
	time.Sleep(100 * time.Millisecond) // the withdrawals left in the background
	const n = 50
	before := calls(t, servers)
	for range n {
		cycle()
	}
	time.Sleep(100 * time.Millisecond)
	per := float64(calls(t, servers)-before) / n / float64(len(servers))
	t.Logf("server commands per cycle and node: %v", per)
	if per > 5.5 {
		t.Errorf("server commands per uncontended cycle and node: %v, want 5", per)
	}
}

// TestRefusedRetriesWriteNothing: a waiting Acquire whose attempt found the
// lock held probes each node's state in the next attempts, writing nothing
// (a GET a node, no script), where a first attempt writes its vote at once
// and writes the holder's back when refused.
func TestRefusedRetriesWriteNothing(t *testing.T) {
	servers := startServers(t, 3)
	// Node timeouts that a loaded machine's latency does not reach: an
	// answer lost to one is a vote the waiter must withdraw, a write.
	holder := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	waiter := privateLocker(t, servers, nil, WithNodeTimeout(time.Second), WithMaxBackoff(5*time.Millisecond))
	ctx := context.Background()
	lease, err := holder.Acquire(ctx, "held", driver.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	before := callsByName(t, servers)
	nodes := int64(len(servers))
	delta := func(by map[string]int64, names ...string) int64 {
		var n int64
		for _, name := range names {
			n += by[name] - before[name]
		}
		return n / nodes
	}
	// Enough attempts (a script or a GET each) to tell one write an attempt
	// from the first attempt's alone.
	waitRefused(t, waiter, "held", servers, func(by map[string]int64) int64 {
		return delta(by, "evalsha", "eval", "get")
	}, 20)
	after := callsByName(t, servers)
	scripts, sets, gets := delta(after, "evalsha", "eval"), delta(after, "set"), delta(after, "get")
	t.Logf("per node: %d scripts, %d SETs, %d GETs", scripts, sets, gets)
	// The first attempt writes its vote and the holder's state back; the
	// attempt that ctx cut short may withdraw from nodes that had not
	// answered it. Writing on every attempt would be 2 SETs each.
	if sets > 4 {
		t.Errorf("%d SETs a node over %d probes, want 2 (the first attempt's), far fewer than one an attempt", sets, gets)
	}
	// The first attempt's vote, and maybe a withdrawal: the probes are
	// GETs, not scripts.
	if scripts > 2 {
		t.Errorf("%d scripts a node over %d probes, want at most 2 (the first attempt's vote and a withdrawal)", scripts, gets)
	}
}

// TestScriptCacheFlushed: after the nodes lost their script caches (a
// restart, SCRIPT FLUSH), a round's acquisition, refresh and release, whose
// commands the Locker builds itself for all the nodes, work, sending each
// script's body to each node until the node has it again, and by its digest
// from then on.
func TestScriptCacheFlushed(t *testing.T) {
	servers := startServers(t, 3)
	// Room for the round trip NOSCRIPT costs, and the body's compilation,
	// on a loaded machine.
	l := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	full := make([]*counter, len(l.nodes))
	for i, n := range l.nodes {
		full[i] = &counter{}
		full[i].reset()
		n.AddHook(full[i])
	}
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 5 * time.Second}
	cycle := func() {
		t.Helper()
		lease, err := l.Acquire(ctx, "flushed", opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Refresh(ctx, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // learns the fences, and loads the scripts
	awaitWithdrawn(t, l, "flushed")
	for _, s := range servers {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
		err := c.ScriptFlush(ctx).Err()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range full {
		f.reset()
	}
	cycle()
	// Calls return at a majority: the last node's may still be on its way,
	// and a call that reaches a node before the body an earlier one sent
	// there is answered NOSCRIPT too. So each script is sent in full to
	// each node at least once, and until the node has its body.
	deadline := time.Now().Add(10 * time.Second)
	scripts := []*goredis.Script{l.acquire, l.refresh, l.release}
	for i := range full {
		for _, s := range scripts {
			for full[i].sent(s) < 1 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if full[i].sent(s) < 1 {
				t.Errorf("node %d: a script never sent in full after the flush, though the node had lost it", i)
			}
		}
	}
	// Once every node has the bodies, scripts are run by their digests. The
	// round that writes a token back (the fence script, not sent since the
	// flush) runs only when a proposal fell behind a node's clock, which a
	// loaded machine's latency can make happen, by design: it may be sent
	// in full once.
	awaitWithdrawn(t, l, "flushed")
	for _, f := range full {
		f.reset()
	}
	cycle()
	cycle()
	awaitWithdrawn(t, l, "flushed")
	for i := range full {
		for _, s := range scripts {
			if n := full[i].sent(s); n != 0 {
				t.Errorf("node %d: a script sent in full %d times once the node had it again, want none", i, n)
			}
		}
		if n := full[i].sent(l.fence); n > 1 {
			t.Errorf("node %d: the fence script sent in full %d times, want once at most", i, n)
		}
	}
}

// TestWaitersProbe: a waiter whose attempt found the lock held probes the
// nodes, writing nothing, until a majority would grant its vote. A lock held
// on a majority but free on the other nodes (a holder's vote lost or
// lapsed there) then costs a waiter no write on those nodes, where voting
// on every attempt would write its vote there and withdraw it again.
func TestWaitersProbe(t *testing.T) {
	servers := startServers(t, 3)
	// Node timeouts that a loaded machine's latency does not reach (see
	// TestRefusedRetriesWriteNothing).
	holder := privateLocker(t, servers, nil, WithNodeTimeout(time.Second))
	waiter := privateLocker(t, servers, nil, WithNodeTimeout(time.Second), WithMaxBackoff(5*time.Millisecond))
	ctx := context.Background()
	lease, err := holder.Acquire(ctx, "probed", driver.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	// The holder's vote on the last node withdrawn behind its back: the
	// lock stays held on the other two, a majority.
	withdrawBehind(t, holder.nodes[2], "probed")
	before := callsByName(t, servers[2:])
	// Attempts: the first one's vote, then probes (GETs).
	attempts := func(by map[string]int64) int64 {
		return by["evalsha"] + by["eval"] + by["get"] - before["evalsha"] - before["eval"] - before["get"]
	}
	waitRefused(t, waiter, "probed", servers[2:], attempts, 20)
	after := callsByName(t, servers[2:])
	sets := after["set"] - before["set"]
	t.Logf("on the free node: %d scripts and GETs, %d SETs", attempts(after), sets)
	// The first attempt writes its vote there and withdraws it (3 SETs: the
	// withdrawal of a failed attempt knows neither the fence nor the day,
	// and corrects them); the probes after it write nothing. A withdrawal
	// still on its way when the counts were read only makes fewer.
	if sets > 3 {
		t.Errorf("%d SETs on the node where the lock is free, over %d scripts and GETs: the waiter voted there after its first attempt, want 3", sets, attempts(after))
	}
}

// withdrawBehind withdraws the vote for key on node behind its holder's
// back, as a vote lost or lapsed there looks to the others.
func withdrawBehind(t *testing.T, node goredis.UniversalClient, key string) {
	t.Helper()
	ctx, lock := context.Background(), lockKeyOf(key)
	v, err := node.Get(ctx, lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(v, ":")
	fence, rest, _ := strings.Cut(rest, ":")
	day, _, _ := strings.Cut(rest, ":")
	if err := node.Set(ctx, lock, "0:"+fence+":"+day+":", goredis.KeepTTL).Err(); err != nil {
		t.Fatal(err)
	}
}

// probeRounds counts a Locker's probes by round: gather gives the calls of
// a round one context, and a probe of a node is a GET, in a pipeline with
// a TIME where it reads the node's clock (go-redis also sends a new
// connection's handshake as a pipeline).
type probeRounds struct {
	mu     sync.Mutex
	rounds map[context.Context]int
	clocks int // the probes that read a node's clock
}

func (p *probeRounds) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (p *probeRounds) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "get" {
			p.mu.Lock()
			p.rounds[ctx]++
			p.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (p *probeRounds) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) == 2 && cmds[0].Name() == "get" && cmds[1].Name() == "time" {
			p.mu.Lock()
			p.rounds[ctx]++
			p.clocks++
			p.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// sizes lists the number of nodes each round asked.
func (p *probeRounds) sizes() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for _, n := range p.rounds {
		out = append(out, n)
	}
	return out
}

// clocksRead is how many probes of a node read its clock.
func (p *probeRounds) clocksRead() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clocks
}

// heldAndProbed: a lock on a key named after name, held for 30s by a
// Locker on the shared nodes, and a waiter on them whose probes p counts,
// pausing 5ms at most between them.
func heldAndProbed(t *testing.T, name string) (holder, waiter *Locker, p *probeRounds, key string) {
	t.Helper()
	holder = sharedLocker(t)
	waiter = sharedLocker(t, WithNodeTimeout(time.Second), WithMaxBackoff(5*time.Millisecond))
	p = &probeRounds{rounds: map[context.Context]int{}}
	for _, n := range waiter.nodes {
		n.AddHook(p)
	}
	ctx := context.Background()
	key = fmt.Sprintf("%s/%d", name, time.Now().UnixNano())
	lease, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Release(ctx) })
	return holder, waiter, p, key
}

// probeHeld runs a waiting Acquire of key, held on every node, on waiter
// until p has counted 20 probes, however slowly a loaded machine lets it
// (failing the test after 20s), then ends it. It returns how long the wait
// took.
func probeHeld(t *testing.T, waiter *Locker, key string, p *probeRounds) time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, key, driver.AcquireOptions{TTL: 30 * time.Second, Wait: true})
		done <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for len(p.sizes()) < 20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("acquired a lock held on every node")
	}
	took := time.Since(start)
	if n := len(p.sizes()); n < 20 {
		t.Fatalf("%d probes in 20s with pauses of 5ms at most", n)
	}
	return took
}

// TestProbesReadAMajority: a waiter's probe of a lock held on every node
// reads a majority of the nodes, which settles that the lock is held, and
// not the others.
func TestProbesReadAMajority(t *testing.T) {
	_, waiter, p, key := heldAndProbed(t, "probe-majority")
	probeHeld(t, waiter, key, p)
	// The lock is held on every node: no probe reads on past its first
	// majority, whose answers settle it. One probe, the one under way when
	// probeHeld cancelled the wait, may have read fewer.
	sizes := p.sizes()
	short := 0
	for _, n := range sizes {
		if n < waiter.quorum {
			short++
		}
		if n > waiter.quorum || short > 1 {
			t.Fatalf("probes read %v nodes of %d, want %d (a majority) each", sizes, len(waiter.nodes), waiter.quorum)
		}
	}
}

// TestProbesReuseClocks: a waiter's probes read a node's clock once a
// second at most, and judge the holder's vote by it, moved on by the time
// elapsed since, in between: a GET a node, where reading the clock too
// took a TIME.
func TestProbesReuseClocks(t *testing.T) {
	_, waiter, p, key := heldAndProbed(t, "probe-clocks")
	took := probeHeld(t, waiter, key, p)
	reads := 0
	for _, n := range p.sizes() {
		reads += n
	}
	// Each node's clock read once a second at most, and once more for the
	// second under way.
	most := len(waiter.nodes) * (int(took/clockReuse) + 2)
	t.Logf("%d reads of the nodes' states in %v, %d of their clocks", reads, took.Round(time.Millisecond), p.clocksRead())
	if got := p.clocksRead(); got > most {
		t.Errorf("probes read the nodes' clocks %d times in %d reads over %v, want %d at most", got, reads, took.Round(time.Millisecond), most)
	}
}

// TestNodeClock: a node's clock as a probe read it is moved on by the time
// elapsed since, for clockReuse, and not used before it was read or after.
func TestNodeClock(t *testing.T) {
	at := time.Now()
	c := nodeClock{ms: 1_800_000_000_000, at: at}
	if now, ok := c.now(at.Add(250 * time.Millisecond)); !ok || now != 1_800_000_000_250 {
		t.Errorf("250ms after the read: %d, %v; want 1800000000250, true", now, ok)
	}
	if _, ok := c.now(at.Add(clockReuse)); ok {
		t.Error("used clockReuse after the read")
	}
	if _, ok := (nodeClock{}).now(at); ok {
		t.Error("a clock never read used")
	}
}

// TestProbesReadOnWhenSplit: when the nodes a probe reads first disagree,
// the others settle whether a majority is free: a lock held on a minority
// of the nodes alone (the holder's votes withdrawn from the others) is
// taken by the waiter at its next probe, though that reads a majority of
// which the minority is part first.
func TestProbesReadOnWhenSplit(t *testing.T) {
	holder, waiter, p, key := heldAndProbed(t, "probe-split")
	ctx := context.Background()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		ls, err := waiter.Acquire(wctx, key, driver.AcquireOptions{TTL: 30 * time.Second, Wait: true})
		if err == nil {
			err = ls.Release(ctx)
		}
		done <- err
	}()
	probing := time.Now().Add(20 * time.Second)
	for len(p.sizes()) < 3 {
		if time.Now().After(probing) {
			t.Fatal("the waiter made no 3 probes in 20s")
		}
		time.Sleep(time.Millisecond)
	}
	// The holder's votes withdrawn from all the nodes but the first
	// minority, behind its back.
	for _, n := range holder.nodes[len(holder.nodes)-holder.quorum:] {
		withdrawBehind(t, n, key)
	}
	// The next probes read first the majorities from the last node on, all
	// but one of which hold a node of the minority.
	n := len(holder.nodes)
	waiter.probes.Store(uint32(n - 2))
	first := func() int { // the probes' first rounds so far
		k := 0
		for _, size := range p.sizes() {
			if size == waiter.quorum {
				k++
			}
		}
		return k
	}
	before := first()
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	// The probe under way when the votes went, and the next one.
	if k := first() - before; k > 2 {
		t.Errorf("%d probes once a majority was free, want 2 at most", k)
	}
}

// TestProbesAskSilentNodesLast: a node that failed its last call is not
// among the nodes a probe asks first: one that does not answer would hold
// each probe it is part of to the node timeout, and with it the waiter's
// turn once the lock is free (a silent node added half a node timeout to
// the handoff, on average, when probes took it in their turn).
func TestProbesAskSilentNodesLast(t *testing.T) {
	holder := sharedLocker(t)
	nodes, proxies := proxiedNodes(t)
	waiter, err := New(nodes, WithNodeTimeout(250*time.Millisecond), WithMaxBackoff(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	all, silent := &probeRounds{rounds: map[context.Context]int{}}, &probeRounds{rounds: map[context.Context]int{}}
	for _, n := range nodes {
		n.AddHook(all)
	}
	nodes[0].AddHook(silent)
	proxies[0].Blackhole()
	ctx := context.Background()
	key := fmt.Sprintf("probe-silent/%d", time.Now().UnixNano())
	lease, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	probeHeld(t, waiter, key, all)
	if got := len(silent.sizes()); got > 0 {
		t.Errorf("%d of %d probes asked the silent node, want none: it failed the vote before them", got, len(all.sizes()))
	}
}

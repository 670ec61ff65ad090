package redlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestCallsBoundedByContext: against nodes that go silent (they act on
// what they are sent, their answers are lost), through clients with
// go-redis's default options, which ignore ctx while they wait for an
// answer, every call returns within its ctx's bound, far below the node
// timeout; the acquisition and the release cut short still withdraw their
// votes, in the background.
func TestCallsBoundedByContext(t *testing.T) {
	const (
		nodeTimeout = time.Second
		bound       = 300 * time.Millisecond
		// slack is what a call may take past its bound on a loaded
		// machine; the figures are logged.
		slack = 100 * time.Millisecond
	)
	direct := sharedLocker(t)
	nodes, proxies := proxiedNodes(t)
	for _, c := range nodes {
		warm(t, c.(*goredis.Client), 8)
	}
	l, err := New(nodes, WithNodeTimeout(nodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	if !l.BoundedByContext() {
		t.Fatal("BoundedByContext is false")
	}
	held := fmt.Sprintf("bounded-held-%d", time.Now().UnixNano())
	taken := fmt.Sprintf("bounded-taken-%d", time.Now().UnixNano())
	ttl := MinTTLFactor * nodeTimeout
	ls, err := l.Acquire(context.Background(), held, driver.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	loadScripts(t, direct)
	for _, p := range proxies {
		p.LoseReplies()
	}

	within := func(name string, f func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		start := time.Now()
		err := f(ctx)
		took := time.Since(start)
		t.Logf("%s: %v, %v", name, took.Round(time.Millisecond), err)
		if err == nil {
			t.Errorf("%s succeeded against silent nodes", name)
		}
		if took > bound+slack {
			t.Errorf("%s took %v, ctx's bound %v (node timeout %v)", name, took, bound, nodeTimeout)
		}
	}
	within("Acquire", func(ctx context.Context) error {
		_, err := l.Acquire(ctx, taken, driver.AcquireOptions{TTL: ttl, Wait: true})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire: %v, want ctx's error", err)
		}
		return err
	})
	within("Ping", l.Ping)
	within("Refresh", func(ctx context.Context) error { return ls.Refresh(ctx, ttl) })
	within("Release", ls.Release)

	// The nodes got every request: the votes taken are withdrawn.
	awaitWithdrawn(t, direct, taken)
	awaitWithdrawn(t, direct, held)
}

// proxiedNodes returns a client of each shared node, with go-redis's
// default options (which wait out their own timeouts whatever ctx says),
// each through a Proxy of its own.
func proxiedNodes(t testing.TB) ([]goredis.UniversalClient, []*drivertest.Proxy) {
	addrs := strings.Split(drivertest.Addr(t, addrsEnv, addrsDefault), ",")
	proxies := make([]*drivertest.Proxy, len(addrs))
	nodes := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		proxies[i] = drivertest.StartProxy(t, a)
		c := goredis.NewClient(&goredis.Options{Addr: proxies[i].Addr()})
		t.Cleanup(func() { c.Close() })
		nodes[i] = c
	}
	return nodes, proxies
}

// warm leaves n connections in c's pool that have said hello to the
// server: a new one, which waits for the server's answer to its HELLO
// before it sends anything, would send nothing to a silent node.
func warm(t *testing.T, c *goredis.Client, n int) {
	t.Helper()
	ctx := context.Background()
	conns := make([]*goredis.Conn, n)
	for i := range conns {
		conns[i] = c.Conn()
		if err := conns[i].Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, cn := range conns {
		cn.Close()
	}
}

// cancelOnVotes cancels a context once every node has answered its vote:
// after the acquiring round, before the Locker can hand out its lease.
type cancelOnVotes struct {
	nodes int
	sha   any // acquire.lua's digest, as the Locker sends it
	mu    sync.Mutex
	votes int
	// cancel is the context's, nil when none is armed.
	cancel context.CancelFunc
}

func (c *cancelOnVotes) arm(cancel context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.votes, c.cancel = 0, cancel
}

func (c *cancelOnVotes) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *cancelOnVotes) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "evalsha" && cmd.Args()[1] == c.sha {
			c.mu.Lock()
			if c.votes++; c.votes == c.nodes && c.cancel != nil {
				c.cancel()
			}
			c.mu.Unlock()
		}
		return err
	}
}

func (c *cancelOnVotes) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestNoLeaseOnceContextDone: an acquisition whose ctx ends after every
// node granted its vote, before the lease is handed out, returns ctx's
// error and leaves no vote behind: its caller has stopped waiting, and
// guard, calling the Locker on the caller's goroutine, no longer gives
// such a lease back for it.
func TestNoLeaseOnceContextDone(t *testing.T) {
	l := sharedLocker(t)
	key := fmt.Sprintf("no-late-lease-%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 5 * time.Second}
	learnFences(t, l, key, opts)
	hook := &cancelOnVotes{nodes: len(l.nodes), sha: l.acquireSha}
	for _, n := range l.nodes {
		n.AddHook(hook)
	}
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		hook.arm(cancel)
		ls, err := l.Acquire(ctx, key, opts)
		hook.arm(nil)
		cancel()
		if err == nil {
			ls.Release(context.Background())
			t.Fatal("Acquire handed out a lease after its ctx was cancelled")
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire: %v, want ctx's error", err)
		}
		awaitWithdrawn(t, l, key)
	}
}

// TestAttemptAwaitsOwnWithdrawal: an acquisition right after one whose ctx
// ended with its withdrawal still under way waits for that withdrawal,
// rather than find the Locker's own votes still there and take the lock
// for held (a direct retry was refused so 21 times in 300).
func TestAttemptAwaitsOwnWithdrawal(t *testing.T) {
	l := sharedLocker(t, WithNodeTimeout(time.Second))
	key := fmt.Sprintf("own-withdrawal-%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 5 * time.Second}
	learnFences(t, l, key, opts)
	votes := &cancelOnVotes{nodes: len(l.nodes), sha: l.acquireSha}
	slow := &slowWithdrawals{sha: l.releaseSha}
	for _, n := range l.nodes {
		n.AddHook(votes)
		n.AddHook(slow)
	}
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		votes.arm(cancel)
		slow.delay.Store(int64(100 * time.Millisecond))
		_, err := l.Acquire(ctx, key, opts)
		votes.arm(nil)
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire cancelled after the votes: %v, want ctx's error", err)
		}
		ls, err := l.Acquire(context.Background(), key, opts)
		slow.delay.Store(0)
		if err != nil {
			t.Fatalf("Acquire right after, the lock free but for the withdrawal under way: %v", err)
		}
		if err := ls.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		awaitWithdrawn(t, l, key)
	}
}

// slowWithdrawals holds back every withdrawal (release.lua) by delay before
// it is sent.
type slowWithdrawals struct {
	sha   any // release.lua's digest, as the Locker sends it
	delay atomic.Int64
}

func (s *slowWithdrawals) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (s *slowWithdrawals) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "evalsha" && cmd.Args()[1] == s.sha {
			time.Sleep(time.Duration(s.delay.Load()))
		}
		return next(ctx, cmd)
	}
}

func (s *slowWithdrawals) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// learnFences runs a cycle on key, which lets l learn the nodes' fences:
// its votes then record the token, with no second round after them.
func learnFences(t *testing.T, l *Locker, key string, opts driver.AcquireOptions) {
	t.Helper()
	ls, err := l.Acquire(context.Background(), key, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	awaitWithdrawn(t, l, key)
}

// TestOwnWithdrawalAwaitedWithinNodeTimeout: the wait for a withdrawal
// left under way ends with its round, at the node timeout, though its
// call to a silent node goes on: with go-redis's default options, that
// call holds its connection for the client's 3s read timeout (for ever
// with none), and the next Acquire of the key, on a lock free but for
// that node, waited that long.
func TestOwnWithdrawalAwaitedWithinNodeTimeout(t *testing.T) {
	direct := sharedLocker(t)
	loadScripts(t, direct)
	nodes, proxies := proxiedNodes(t)
	for _, c := range nodes {
		warm(t, c.(*goredis.Client), 8)
	}
	l, err := New(nodes, WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("silent-withdrawal-%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 5 * time.Second, Wait: true}
	proxies[0].Blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err = l.Acquire(ctx, key, opts)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire cut short by its ctx: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	ls, err := l.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatalf("Acquire of a lock free on 4 nodes of 5: %v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("acquired after %v", time.Since(start).Round(time.Millisecond))
	ls.Release(context.Background())
}

// TestWithdrawalsJoined: two withdrawals from one lock left under way (two
// goroutines of a Locker on one key) are both awaited: the second's record
// replaced the first's, and the first goroutine's retry found its own
// votes still there.
func TestWithdrawalsJoined(t *testing.T) {
	l := sharedLocker(t)
	const lock = "{joined}:lock"
	first, second := make(chan struct{}), make(chan struct{})
	l.recordWithdrawal(lock, first)
	l.recordWithdrawal(lock, second)
	close(second)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.awaitWithdrawals(ctx, lock); err == nil {
		t.Fatal("awaitWithdrawals returned with the first withdrawal still under way")
	}
	close(first)
	if err := l.awaitWithdrawals(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := l.withdrawing.Load(lock); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record of withdrawals over stayed for 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// loadScripts loads every script the Locker sends on every node: a node
// that then goes silent never returns the NOSCRIPT a fresh server answers
// the first EVALSHA of a script with, so the client would never send the
// script's body.
func loadScripts(t *testing.T, l *Locker) {
	t.Helper()
	for _, n := range l.nodes {
		for _, src := range []string{acquireSrc, refreshSrc, releaseSrc} {
			if err := n.ScriptLoad(context.Background(), src).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestProbeBoundedByContext: a waiter's probe of nodes gone silent returns
// once its ctx is done, well before the node timeout, whatever the
// clients do (the bounded-call tests never reach it: against silent nodes
// the first attempt fails, and the waiter never finds the lock held).
func TestProbeBoundedByContext(t *testing.T) {
	const bound, slack = 300 * time.Millisecond, 250 * time.Millisecond
	nodes, proxies := proxiedNodes(t)
	l, err := New(nodes, WithNodeTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		p.Blackhole()
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(bound, cancel)
	defer stop.Stop()
	start := time.Now()
	_, free, _ := l.probeNodes(ctx, lockKeyOf("probe-bounded"), make([]nodeClock, len(nodes)))
	took := time.Since(start)
	if free {
		t.Error("silent nodes probed free")
	}
	if took > bound+slack {
		t.Errorf("probe took %v, its ctx cancelled after %v (node timeout 5s)", took.Round(time.Millisecond), bound)
	}
}

package redlock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// BenchmarkAcquireRelease: an uncontended acquisition and release on the
// shared nodes, for the client's allocations per cycle (-benchmem).
func BenchmarkAcquireRelease(b *testing.B) {
	l := sharedLocker(b)
	ctx := context.Background()
	key := "bench/acquire-release/" + time.Now().Format(time.RFC3339Nano)
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}
	b.ReportAllocs()
	for b.Loop() {
		lease, err := l.Acquire(ctx, key, opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardCycle: one uncontended guard.Do over the Locker, as
// bench-peers's one-worker scenario runs it (10s TTL, waiting, under a
// context that can be cancelled), for the client's cost per cycle:
// allocations (-benchmem), and instructions under callgrind
// (CGO_ENABLED=0, GOGC=off, GODEBUG=asyncpreemptoff=1) by the difference
// between two -benchtime counts.
func BenchmarkGuardCycle(b *testing.B) {
	g, err := guard.New(sharedLocker(b), guard.WithTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := "bench/guard-cycle/" + time.Now().Format(time.RFC3339Nano)
	section := func(context.Context, *guard.Lock) error { return nil }
	if err := g.Do(ctx, key, section); err != nil { // connections open, fences learnt
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Do(ctx, key, section); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkContended: workers, each with a Locker and clients of its own,
// take turns on one key of 5 private nodes, holding it for hold, as
// bench-peers's contended scenario does; b.N acquisitions in all. It reports
// per acquisition the server commands (INFO commandstats, scripts' own
// commands included) and the calls by kind: votes (granted, refused), probes,
// withdrawals of failed attempts, releases, fence write-backs and scripts
// sent in full after NOSCRIPT. cmds-est is the sum of each kind's calls
// times its commands (a vote 3 or 4, see acquire.lua; a probe 1, and 1 more
// where it reads the node's clock; a release 2; a withdrawal, which knows
// neither fence nor day, 3; a fence 2), for the split of cmds by kind.
func BenchmarkContended(b *testing.B) {
	for _, workers := range []int{8, 64} {
		for _, hold := range []time.Duration{0, time.Millisecond} {
			b.Run(fmt.Sprintf("workers=%d/hold=%v", workers, hold), func(b *testing.B) {
				benchContended(b, workers, hold)
			})
		}
	}
}

func benchContended(b *testing.B, workers int, hold time.Duration) {
	servers := make([]*drivertest.RedisServer, 5)
	for i := range servers {
		servers[i] = drivertest.StartRedis(b)
	}
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr()
	}
	var k kinds
	k.reset()
	lockers := make([]*Locker, workers)
	for w := range lockers {
		nodes := clients(b, addrs, nil)
		for _, n := range nodes {
			n.AddHook(&k)
		}
		l, err := New(nodes)
		if err != nil {
			b.Fatal(err)
		}
		lockers[w] = l
	}
	k.acquire, k.release, k.fence = lockers[0].acquire.Hash(), lockers[0].release.Hash(), lockers[0].fence.Hash()
	ctx := context.Background()
	key := "bench/contended"
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}
	// Every Locker learns the fences and opens its connections.
	for _, l := range lockers {
		ls, err := l.Acquire(ctx, key, opts)
		if err != nil {
			b.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	k.reset()
	before := callsByName(b, servers)
	var (
		left     atomic.Int64
		released atomic.Int64 // release calls: the nodes each lease may hold
		wg       sync.WaitGroup
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	for _, l := range lockers {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				ls, err := l.Acquire(ctx, key, opts)
				if err != nil {
					b.Error(err)
					return
				}
				if hold > 0 {
					time.Sleep(hold)
				}
				released.Add(int64(len(ls.(*lease).votes)))
				if err := ls.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	time.Sleep(200 * time.Millisecond) // the calls left in the background
	after := callsByName(b, servers)
	var cmds int64
	for name, n := range after {
		cmds += n - before[name]
	}
	n := float64(b.N)
	c := k.snapshot()
	withdrawals := c.releases - released.Load()
	est := 3*c.granted + 4*c.refused + c.readFirst*1 - 2*c.readFirstRefused + c.probes + c.clocks + 2*released.Load() + 3*withdrawals + 2*c.fences + c.full
	b.ReportMetric(float64(cmds)/n, "cmds/op")
	b.ReportMetric(float64(est)/n, "cmds-est/op")
	b.ReportMetric(float64(c.granted)/n, "granted/op")
	b.ReportMetric(float64(c.refused)/n, "refused/op")
	b.ReportMetric(float64(c.readFirst)/n, "voted-after-probe/op")
	b.ReportMetric(float64(c.probes)/n, "probes/op")
	b.ReportMetric(float64(c.probeRounds)/n, "probe-rounds/op")
	b.ReportMetric(float64(c.clocks)/n, "probe-clocks/op")
	b.ReportMetric(float64(c.voteRounds)/n, "vote-rounds/op")
	b.ReportMetric(float64(withdrawals)/n, "withdrawals/op")
	b.ReportMetric(float64(released.Load())/n, "releases/op")
	b.ReportMetric(float64(c.fences)/n, "fences/op")
	b.ReportMetric(float64(c.full)/n, "noscript/op")
	b.ReportMetric(n/b.Elapsed().Seconds(), "acq/s")
}

// kinds counts the calls a Locker's clients send, by kind (see
// BenchmarkContended).
type kinds struct {
	acquire, release, fence string // the scripts' digests
	mu                      sync.Mutex
	c                       kindCounts
	// rounds holds the contexts of the probes' rounds: gather gives the
	// calls of a round one context.
	rounds map[context.Context]bool
}

type kindCounts struct {
	granted, refused, readFirst, readFirstRefused int64
	voteRounds, probes, probeRounds, releases     int64
	fences, full, clocks                          int64
}

func (k *kinds) reset() {
	k.mu.Lock()
	k.c = kindCounts{}
	k.rounds = map[context.Context]bool{}
	k.mu.Unlock()
}

func (k *kinds) snapshot() kindCounts {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.c
	// A round sends one call a node.
	c.voteRounds = (c.granted + c.refused) / 5
	c.probeRounds = int64(len(k.rounds))
	return c
}

func (k *kinds) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (k *kinds) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if cmd.Name() == "get" { // a probe that read no clock
			k.mu.Lock()
			k.c.probes++
			k.rounds[ctx] = true
			k.mu.Unlock()
		}
		if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
			return err
		}
		sha := fmt.Sprint(args[1])
		k.mu.Lock()
		defer k.mu.Unlock()
		if cmd.Name() == "eval" {
			k.c.full++
			sum := sha1.Sum([]byte(sha))
			sha = hex.EncodeToString(sum[:])
		} else if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return err
		}
		switch sha {
		case k.acquire:
			readFirst := len(args) > 8
			refused := false
			if v, ok := cmd.(*goredis.Cmd).Val().(int64); ok && v != 1 || err != nil {
				refused = true
			}
			if refused {
				k.c.refused++
			} else {
				k.c.granted++
			}
			if readFirst {
				k.c.readFirst++
				if refused {
					k.c.readFirstRefused++
				}
			}
		case k.release:
			k.c.releases++
		case k.fence:
			k.c.fences++
		}
		return err
	}
}

func (k *kinds) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		// go-redis also sends a new connection's handshake as a pipeline.
		if len(cmds) == 2 && cmds[0].Name() == "get" && cmds[1].Name() == "time" {
			k.mu.Lock()
			k.c.probes++
			k.c.clocks++
			k.rounds[ctx] = true
			k.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

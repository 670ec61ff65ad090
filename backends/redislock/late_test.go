package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// holdBackOnce holds back, on p, the one acquisition script the client
// sends next while armed, and no other command: the proxy's delay is set
// while that command is under way.
type holdBackOnce struct {
	p     *drivertest.Proxy
	delay time.Duration
	armed atomic.Bool
}

func (h *holdBackOnce) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *holdBackOnce) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if !strings.HasPrefix(cmd.Name(), "eval") || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmd)
		}
		h.p.SlowRequests(h.delay)
		defer h.p.SlowRequests(0)
		return next(ctx, cmd)
	}
}

func (h *holdBackOnce) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// An attempt that got no answer and reaches the server after its cleanup
// ran (held up on the network, as a lost segment sent again is) takes the
// free lock for an owner nobody holds: the cleanup runs again after a
// while, and gives it back long before its TTL runs out.
func TestLateAttemptGivenBack(t *testing.T) {
	p := drivertest.StartProxy(t, drivertest.Addr(t, addrEnv, addrDefault))
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	h := &holdBackOnce{p: p, delay: 100 * time.Millisecond}
	c.AddHook(h)
	l := newLocker(t, c)
	other := newLocker(t, newClient(t))
	key := fmt.Sprintf("late-attempt-%d", time.Now().UnixNano())
	opts := driver.AcquireOptions{TTL: 30 * time.Second}
	ctx := context.Background()

	// Scripts loaded, connections made.
	lease, err := l.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	h.armed.Store(true)
	actx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_, err = l.Acquire(actx, key, opts)
	cancel()
	if err == nil {
		t.Fatal("an attempt held back 100ms, bounded by 10ms, succeeded")
	}

	// The held-back attempt lands on the free lock 100ms after it was
	// sent, after its cleanup, and takes it: its state names an owner.
	// Read, not tried, so that no attempt of the test's takes the lock
	// first.
	state := newClient(t)
	held := func() bool {
		v, err := state.Get(ctx, mutexNamesOf(key).lock).Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			t.Fatal(err)
		}
		f := strings.SplitN(v, ":", 5)
		return len(f) == 5 && f[0] != "0" && f[4] != ""
	}
	deadline := time.Now().Add(5 * time.Second)
	for !held() {
		if time.Now().After(deadline) {
			t.Fatal("the held-back attempt did not take the lock within 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	seen := time.Now()
	deadline = seen.Add(10 * time.Second)
	for {
		lease, err := other.Acquire(ctx, key, opts)
		if err == nil {
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the lock a late attempt took for nobody was not given back within 10s (its TTL: 30s)")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the lock a late attempt took was given back %v after it was seen taken", time.Since(seen).Round(time.Millisecond))
}

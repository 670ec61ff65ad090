package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/idempotency"
)

// serverPID is the process id of the redis-server c is connected to.
func serverPID(t *testing.T, c *goredis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatal("INFO server names no process_id")
	return 0
}

// TestStoreStoppedServerBounded: with go-redis's default options, which
// ignore the context's deadline, wait out a 3 s read timeout and then send
// the command again, a request whose context has no deadline waits for a
// stopped Redis no longer than the Executor's call timeout (and a
// scheduling margin): the work does not run, the claim that lands when the
// server resumes (sent twice by go-redis) is given back, and another
// process then claims the key and runs the work once, within the lease.
func TestStoreStoppedServerBounded(t *testing.T) {
	addr, _ := privateServer(t, 0)
	c := goredis.NewClient(&goredis.Options{Addr: addr}) // go-redis's defaults
	t.Cleanup(func() { c.Close() })
	pid := serverPID(t, c)
	const bound, lease, margin, stopped = time.Second, 3 * time.Second, 250 * time.Millisecond, 5 * time.Second
	e, err := idempotency.New(newStore(t, c), idempotency.WithCallTimeout(bound), idempotency.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var runs atomic.Int64
	fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("done"), nil }
	if _, err := e.Do(ctx, "warm", "fp", fn); err != nil {
		t.Fatalf("Do before the stop: %v", err)
	}
	runs.Store(0)

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	start := time.Now()
	_, err = e.Do(ctx, "k", "fp", fn)
	took := time.Since(start)
	if !errors.Is(err, idempotency.ErrUnavailable) || took > bound+margin {
		t.Fatalf("Do against the stopped server: %v after %v, want ErrUnavailable within %v", err, took, bound+margin)
	}
	time.Sleep(stopped - took)
	resume()
	resumedAt := time.Now()

	other := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { other.Close() })
	oe, err := idempotency.New(newStore(t, other), idempotency.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, err := oe.Do(ctx, "k", "fp", fn)
		if err == nil {
			break
		}
		if !errors.Is(err, idempotency.ErrInProgress) || time.Since(resumedAt) > lease+2*time.Second {
			t.Fatalf("the other process %v after the resume: %v, want the key claimable within the %v lease", time.Since(resumedAt), err, lease)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("Do returned after %v; the other process ran the work %v after the resume", took, time.Since(resumedAt))
	if n := runs.Load(); n != 1 {
		t.Errorf("the work ran %d times, want once", n)
	}
}

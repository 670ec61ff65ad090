package redislock

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// TestStoreStoppedServerBounded: with go-redis's default options, which
// ignore the context's deadline, wait out a 5 s read timeout and then send
// the command again, a request whose context has no deadline waits for a
// stopped Redis no longer than the Executor's call timeout (and a
// scheduling margin): the work does not run, the claim that lands when the
// server resumes (sent twice by go-redis) is given back, and another
// process then claims the key and runs the work once, within the lease.
func TestStoreStoppedServerBounded(t *testing.T) {
	server := drivertest.StartRedis(t)
	c := goredis.NewClient(&goredis.Options{Addr: server.Addr()}) // go-redis's defaults
	t.Cleanup(func() { c.Close() })
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

	server.Signal(t, syscall.SIGSTOP)
	start := time.Now()
	_, err = e.Do(ctx, "k", "fp", fn)
	took := time.Since(start)
	if !errors.Is(err, idempotency.ErrUnavailable) || took > bound+margin {
		t.Fatalf("Do against the stopped server: %v after %v, want ErrUnavailable within %v", err, took, bound+margin)
	}
	time.Sleep(stopped - took)
	server.Signal(t, syscall.SIGCONT)
	resumedAt := time.Now()

	other := goredis.NewClient(&goredis.Options{Addr: server.Addr()})
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

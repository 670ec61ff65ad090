package etcd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/backendtest"
	"github.com/warden-go/warden/guard"
)

// The holder process of TestKilledHolder: the test binary run again with
// these variables set.
const (
	holderKeyEnv = "WARDEN_ETCD_TEST_HOLDER_KEY"
	holderTTL    = MinTTL
)

// TestHelperHolder is not a test: it is the body of the holder process that
// TestKilledHolder starts and kills. It takes the lock, says so on stdout
// and holds it until killed.
func TestHelperHolder(t *testing.T) {
	key := os.Getenv(holderKeyEnv)
	if key == "" {
		t.Skip("helper process for TestKilledHolder")
	}
	l, _ := newLocker(t, endpoints(t))
	lease, err := l.Acquire(context.Background(), key, guard.AcquireOptions{TTL: holderTTL})
	if err != nil {
		fmt.Printf("ERROR %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("HELD %d\n", lease.Token())
	select {}
}

// TestKilledHolder kills -9 a process holding a lock: the next waiter must get
// it within the session TTL plus one second.
func TestKilledHolder(t *testing.T) {
	eps := endpoints(t)
	key := fmt.Sprintf("killed-holder/%d", time.Now().UnixNano())
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), holderKeyEnv+"="+key, endpointsEnv+"="+strings.Join(eps, ","))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the holder process: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if f := s.Text(); strings.HasPrefix(f, "HELD ") || strings.HasPrefix(f, "ERROR ") {
				line <- f
				break
			}
		}
		io.Copy(io.Discard, stdout)
		close(line)
	}()
	var held string
	select {
	case held = <-line:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder process did not take the lock")
	}
	heldTok, err := strconv.ParseUint(strings.TrimPrefix(held, "HELD "), 10, 64)
	if err != nil {
		t.Fatalf("holder process: %s", held)
	}

	waiter, c := newLocker(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		lease guard.Lease
		err   error
		at    time.Time
	}
	got := make(chan result, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, key, guard.AcquireOptions{TTL: MinTTL, Wait: true})
		got <- result{lease, err, time.Now()}
	}()
	waitFor(t, "the waiter is queued", func() bool { return len(keysUnder(t, c, waiter, key)) == 2 })

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	defer r.lease.Release(context.Background())
	if took, bound := r.at.Sub(killed), holderTTL+time.Second; took > bound {
		t.Errorf("the waiter got the lock %v after the holder was killed, more than %v", took, bound)
	} else {
		t.Logf("the waiter got the lock %v after the holder was killed", took)
	}
	if r.lease.Token() <= heldTok {
		t.Errorf("token %d after the killed holder's %d", r.lease.Token(), heldTok)
	}
}

// TestCutConnection cuts the holder off from the server (connections closed,
// or silently dropping every byte): the holder's lease must report the loss
// through Done before the waiter is granted the lock.
func TestCutConnection(t *testing.T) {
	for _, blackhole := range []bool{false, true} {
		name := "closed"
		if blackhole {
			name = "blackholed"
		}
		t.Run(name, func(t *testing.T) {
			eps := endpoints(t)
			p := backendtest.StartProxy(t, eps[0])
			holder, _ := newLocker(t, []string{p.Addr()})
			waiter, c := newLocker(t, eps)
			key := fmt.Sprintf("cut/%s/%d", name, time.Now().UnixNano())
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			held, err := holder.Acquire(ctx, key, guard.AcquireOptions{TTL: MinTTL})
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				lease    guard.Lease
				err      error
				doneSeen bool
			}
			got := make(chan result, 1)
			go func() {
				lease, err := waiter.Acquire(ctx, key, guard.AcquireOptions{TTL: MinTTL, Wait: true})
				r := result{lease: lease, err: err}
				select {
				case <-held.Done():
					r.doneSeen = true
				default:
				}
				got <- r
			}()
			waitFor(t, "the waiter is queued", func() bool { return len(keysUnder(t, c, waiter, key)) == 2 })

			if blackhole {
				p.Blackhole()
			} else {
				p.Cut()
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("waiter: %v", r.err)
			}
			defer r.lease.Release(context.Background())
			if !r.doneSeen {
				t.Fatal("the waiter was granted the lock before the cut-off holder's Done fired")
			}
			if err := held.Refresh(ctx, MinTTL); !errors.Is(err, guard.ErrNotHeld) {
				t.Errorf("Refresh of the lost lease: got %v, want ErrNotHeld", err)
			}
			if r.lease.Token() <= held.Token() {
				t.Errorf("token %d after the lost holder's %d", r.lease.Token(), held.Token())
			}
		})
	}
}

// TestCancelledWaitersLeaveNoKey cancels waiters at every stage (before the
// request, during it, while queued) and lists the keys afterwards: only the
// holder's may remain.
func TestCancelledWaitersLeaveNoKey(t *testing.T) {
	eps := endpoints(t)
	holder, c := newLocker(t, eps)
	key := fmt.Sprintf("cancelled-waiters/%d", time.Now().UnixNano())
	held, err := holder.Acquire(context.Background(), key, guard.AcquireOptions{TTL: MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	lockers := []*Locker{holder}
	for range 2 {
		l, _ := newLocker(t, eps)
		lockers = append(lockers, l)
	}
	var wg sync.WaitGroup
	var unexpected atomic.Int32
	for i := range 30 {
		l := lockers[i%len(lockers)]
		// From already expired to well after the waiter is queued.
		timeout := time.Duration(i*i) * 100 * time.Microsecond
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			var err error
			switch i % 3 {
			case 0:
				_, err = l.Acquire(ctx, key, guard.AcquireOptions{TTL: MinTTL, Wait: true})
			case 1:
				_, err = l.AcquireRead(ctx, key, guard.AcquireOptions{TTL: MinTTL, Wait: true})
			default:
				_, err = l.AcquireSemaphore(ctx, key, 1, guard.AcquireOptions{TTL: MinTTL, Wait: true})
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("waiter %d (timeout %v): got %v, want context.DeadlineExceeded", i, timeout, err)
				unexpected.Add(1)
			}
		})
	}
	wg.Wait()
	if keys := keysUnder(t, c, holder, key); len(keys) != 1 || keys[0] != held.(*lease).own {
		t.Errorf("keys left after the waiters gave up: %q, want only the holder's %q", keys, held.(*lease).own)
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if keys := keysUnder(t, c, holder, key); len(keys) != 0 {
		t.Errorf("keys left after release: %q", keys)
	}
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

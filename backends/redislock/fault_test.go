package redislock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// The holder process: a re-exec of this test binary that takes a lock on the
// shared server and then does nothing, until the parent kills it with -9.
const (
	helperEnv   = "WARDEN_REDIS_TEST_HELPER" // "hold" or "wait"
	helperKey   = "WARDEN_REDIS_TEST_KEY"
	helperTTLms = "WARDEN_REDIS_TEST_TTL_MS"
)

func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("helper process for the fault tests")
	}
	ms, _ := strconv.Atoi(os.Getenv(helperTTLms))
	l := newLocker(t, newClient(t), WithWaiterTimeout(time.Second))
	opts := driver.AcquireOptions{TTL: time.Duration(ms) * time.Millisecond, Fair: true, Wait: mode == "wait"}
	fmt.Println("ready")
	lease, err := l.Acquire(context.Background(), os.Getenv(helperKey), opts)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("held", lease.Token())
	select {} // until killed
}

// startHelper runs the helper process and returns its output lines.
func startHelper(t *testing.T, mode, key string, ttl time.Duration) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperKey+"="+key,
		helperTTLms+"="+strconv.FormatInt(ttl.Milliseconds(), 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return cmd, lines
}

func expectLine(t *testing.T, lines <-chan string, prefix string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("helper exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return strings.TrimSpace(strings.TrimPrefix(l, prefix))
			}
			if strings.HasPrefix(l, "error") {
				t.Fatalf("helper: %s", l)
			}
		case <-timeout:
			t.Fatalf("helper did not print %q", prefix)
		}
	}
}

func testKey(t *testing.T) string {
	return fmt.Sprintf("fault/%s/%d", t.Name(), time.Now().UnixNano())
}

// TestKilledHolderFreesAfterTTL: a holder killed with -9 releases nothing;
// its lock is taken again once Redis expires it, with a greater token.
func TestKilledHolderFreesAfterTTL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newClient(t)
	l := newLocker(t, c)
	key := testKey(t)
	const ttl = time.Second
	cmd, lines := startHelper(t, "hold", key, ttl)
	held, err := strconv.ParseUint(expectLine(t, lines, "held"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed := time.Now()
	if _, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire right after the holder died: got %v, want ErrNotAcquired", err)
	}
	lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Wait: true})
	if err != nil {
		t.Fatalf("waiting for the dead holder's lock: %v", err)
	}
	t.Logf("lock of the killed holder taken %v after the kill", time.Since(killed))
	if lease.Token() <= held {
		t.Errorf("token %d, not above the dead holder's %d", lease.Token(), held)
	}
	if err := lease.Release(ctx); err != nil {
		t.Error(err)
	}
}

// TestKilledFairWaiterLosesPlace: a fair waiter killed with -9 while queued
// does not hold up the waiters behind it for longer than its waiter timeout.
func TestKilledFairWaiterLosesPlace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	probe := newClient(t)
	holder := newLocker(t, newClient(t), WithWaiterTimeout(time.Second))
	next := newLocker(t, newClient(t), WithWaiterTimeout(time.Second))
	key := testKey(t)
	held, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Fair: true})
	if err != nil {
		t.Fatal(err)
	}
	cmd, lines := startHelper(t, "wait", key, time.Minute)
	expectLine(t, lines, "ready")
	eventually(t, "the helper is queued", func() bool { return waiters(t, probe, key) == 1 })
	got := make(chan error, 1)
	go func() {
		lease, err := next.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Second, Wait: true, Fair: true})
		if err == nil {
			err = lease.Release(context.Background())
		}
		got <- err
	}()
	eventually(t, "the second waiter is queued", func() bool { return waiters(t, probe, key) == 2 })
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter behind a dead one: %v", err)
	}
	if n := waiters(t, probe, key); n != 0 {
		t.Errorf("%d waiters left queued", n)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

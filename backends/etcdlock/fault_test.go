package etcdlock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
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
	lease, err := l.Acquire(context.Background(), key, opts(holderTTL, false))
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
	key := name("killed-holder")
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
		lease driver.Lease
		err   error
		at    time.Time
	}
	got := make(chan result, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, key, opts(MinTTL, true))
		got <- result{lease, err, time.Now()}
	}()
	waitFor(t, "the waiter is queued", func() bool { return len(keysUnder(t, c, key)) == 2 })

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
		mode := "closed"
		if blackhole {
			mode = "blackholed"
		}
		t.Run(mode, func(t *testing.T) {
			eps := endpoints(t)
			p := drivertest.StartProxy(t, eps[0])
			holder, _ := newLocker(t, []string{p.Addr()})
			waiter, c := newLocker(t, eps)
			key := name("cut/" + mode)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			held, err := holder.Acquire(ctx, key, opts(MinTTL, false))
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				lease    driver.Lease
				err      error
				doneSeen bool
			}
			got := make(chan result, 1)
			go func() {
				lease, err := waiter.Acquire(ctx, key, opts(MinTTL, true))
				r := result{lease: lease, err: err}
				select {
				case <-held.(driver.SessionLease).Session().Done():
					r.doneSeen = true
				default:
				}
				got <- r
			}()
			waitFor(t, "the waiter is queued", func() bool { return len(keysUnder(t, c, key)) == 2 })

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
			if err := held.Refresh(ctx, MinTTL); !errors.Is(err, driver.ErrNotHeld) {
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
// holder's may remain, once the removals the waiters left to the
// background are done.
func TestCancelledWaitersLeaveNoKey(t *testing.T) {
	eps := endpoints(t)
	holder, c := newLocker(t, eps)
	key := name("cancelled-waiters")
	held, err := holder.Acquire(context.Background(), key, opts(MinTTL, false))
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
				_, err = l.Acquire(ctx, key, opts(MinTTL, true))
			case 1:
				_, err = l.AcquireRead(ctx, key, opts(MinTTL, true))
			default:
				_, err = l.AcquireSemaphore(ctx, key, 1, opts(MinTTL, true))
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("waiter %d (timeout %v): got %v, want context.DeadlineExceeded", i, timeout, err)
				unexpected.Add(1)
			}
		})
	}
	wg.Wait()
	// A waiter that gave up during its put has its key removed once the put
	// is answered, after Acquire returned.
	waitFor(t, "only the holder's key is left", func() bool {
		keys := keysUnder(t, c, key)
		return len(keys) == 1 && keys[0] == held.(*lease).key()
	})
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if keys := keysUnder(t, c, key); len(keys) != 0 {
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

// closedAddr returns a local address nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestUnreachable: with no server to answer (nothing listening, or a proxy
// that swallows every byte), an acquisition that does not wait, and every
// store call, fail with ErrUnavailable within the request timeout, whatever
// the caller's context; a waiting acquisition keeps trying until its own
// deadline and reports that.
func TestUnreachable(t *testing.T) {
	const (
		timeout = 500 * time.Millisecond
		slack   = 2 * time.Second
	)
	for _, mode := range []string{"closed-port", "blackholed"} {
		t.Run(mode, func(t *testing.T) {
			addr := closedAddr(t)
			if mode == "blackholed" {
				p := drivertest.StartProxy(t, endpoints(t)[0])
				p.Blackhole()
				addr = p.Addr()
			}
			c := newClient(t, []string{addr})
			l := lockerOn(t, c, WithRequestTimeout(timeout))
			g, err := guard.New(l, guard.WithTTL(MinTTL), guard.WithPrefix(testPrefix))
			if err != nil {
				t.Fatal(err)
			}
			within := func(what string, bound time.Duration, call func() error, want error) {
				t.Helper()
				start := time.Now()
				err := call()
				took := time.Since(start)
				if !errors.Is(err, want) {
					t.Errorf("%s: got %v, want %v", what, err, want)
				}
				if want == driver.ErrUnavailable && errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: %v would pass for the caller's own deadline", what, err)
				}
				if took > bound {
					t.Errorf("%s took %v, more than %v", what, took, bound)
				}
			}
			within("TryLock(context.Background())", timeout+slack, func() error {
				_, err := g.TryLock(context.Background(), "unreachable")
				return err
			}, guard.ErrUnavailable)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			within("Acquire with a distant deadline", timeout+slack, func() error {
				_, err := l.Acquire(ctx, name("unreachable"), opts(MinTTL, false))
				return err
			}, driver.ErrUnavailable)
			within("waiting Acquire", 3*timeout+slack, func() error {
				wctx, cancel := context.WithTimeout(context.Background(), 3*timeout)
				defer cancel()
				_, err := l.Acquire(wctx, name("unreachable"), opts(MinTTL, true))
				return err
			}, context.DeadlineExceeded)

			s, err := NewStore(c, WithStoreRequestTimeout(timeout), WithStorePrefix(testPrefix+"store"))
			if err != nil {
				t.Fatal(err)
			}
			within("Store.Claim", timeout+slack, func() error {
				_, err := s.Claim(context.Background(), idempotency.Claim{Key: "unreachable", Owner: "o", Lease: MinTTL})
				return err
			}, idempotency.ErrUnavailable)
			within("Store.Get", timeout+slack, func() error {
				_, err := s.Get(context.Background(), "", "unreachable")
				return err
			}, idempotency.ErrUnavailable)
		})
	}
}

// swallower makes chosen unary calls of a client go unanswered, as during a
// leader election, while the keepalive stream carries on.
type swallower struct {
	on      atomic.Bool
	methods []string
}

func (sw *swallower) dialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if sw.on.Load() && slices.Contains(sw.methods, method) {
			<-ctx.Done()
			return ctx.Err()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}

// TestReleaseWithoutAnswer is the lock stuck for good after a leader
// election: the release's delete, and then the revocation, get no answer,
// while the keepalive stream goes on renewing the session. The session must
// be given up, so that the key is gone within the session TTL (plus the
// leader's half-second expiry tick and a margin), and later acquisitions
// must use a new session.
func TestReleaseWithoutAnswer(t *testing.T) {
	const timeout = 500 * time.Millisecond
	eps := endpoints(t)
	sw := &swallower{methods: []string{"/etcdserverpb.KV/DeleteRange", "/etcdserverpb.Lease/LeaseRevoke"}}
	c := newClient(t, eps, sw.dialOption())
	l := lockerOn(t, c, WithRequestTimeout(timeout))
	probe := newClient(t, eps)
	ctx := context.Background()
	k := name("release-without-answer")
	held, err := l.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	sess := held.(driver.SessionLease).Session()

	sw.on.Store(true)
	start := time.Now()
	if err := held.Release(ctx); !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("unanswered Release: got %v, want ErrUnavailable", err)
	}
	select {
	case <-sess.Done():
	case <-time.After(time.Second):
		t.Fatal("the session was not given up after a release without answer")
	}
	bound := timeout + MinTTL + 2*time.Second
	deadline := start.Add(bound)
	for len(keysUnder(t, probe, k)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the key of the unanswered release is still there %v later", time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the key was gone %v after the release began", time.Since(start))
	sw.on.Store(false)

	again, err := l.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatalf("Acquire after the session was given up: %v", err)
	}
	if again.(driver.SessionLease).Session() == sess {
		t.Error("the given-up session was used again")
	}
	if err := again.Release(ctx); err != nil {
		t.Error(err)
	}
}

// TestGivenUpSessionSparesItsHolders: a session given up (here, because a
// release of one of its locks got no answer) is revoked, but not before
// the margin has passed since its holders were told of the loss: a lease
// that runs out would have left their sections that long to stop before
// the locks could go to anyone else, and a revocation sent at once left
// them a round trip.
func TestGivenUpSessionSparesItsHolders(t *testing.T) {
	const ttl = 20 * time.Second // a margin of 2s
	eps := endpoints(t)
	sw := &swallower{methods: []string{"/etcdserverpb.KV/DeleteRange"}}
	l := lockerOn(t, newClient(t, eps, sw.dialOption()), WithRequestTimeout(500*time.Millisecond))
	probe := newClient(t, eps)
	ctx := context.Background()
	kept, unanswered := name("spared-kept"), name("spared-unanswered")
	held, err := l.Acquire(ctx, kept, opts(ttl, false))
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.Acquire(ctx, unanswered, opts(ttl, false))
	if err != nil {
		t.Fatal(err)
	}
	sess := held.(driver.SessionLease).Session()
	if other.(driver.SessionLease).Session() != sess {
		t.Fatal("the two locks are not on one session")
	}
	sw.on.Store(true)
	if err := other.Release(ctx); !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("unanswered Release: got %v, want ErrUnavailable", err)
	}
	<-sess.Done()
	told := time.Now()
	time.Sleep(200 * time.Millisecond)
	if len(keysUnder(t, probe, kept)) == 0 {
		t.Fatalf("the held lock's key was revoked within %v of its holder being told of the loss, margin %v",
			time.Since(told).Round(time.Millisecond), ttl/10)
	}
	// Then revoked, long before the lease would run out.
	deadline := told.Add(ttl / 2)
	for len(keysUnder(t, probe, kept)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the held lock's key is still there %v after the loss: not revoked", time.Since(told).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if gone := time.Since(told); gone < ttl/10 {
		t.Fatalf("the held lock's key was gone %v after the loss, before the margin %v", gone.Round(time.Millisecond), ttl/10)
	}
}

// TestCleanupWithoutAnswer: a waiter whose context ends while it is queued
// deletes its key; when that delete gets no answer the key must still go
// within the session TTL, instead of blocking the lock behind it for as long
// as the keepalive runs.
func TestCleanupWithoutAnswer(t *testing.T) {
	const timeout = 500 * time.Millisecond
	eps := endpoints(t)
	holder, probe := newLocker(t, eps)
	sw := &swallower{methods: []string{"/etcdserverpb.KV/DeleteRange", "/etcdserverpb.Lease/LeaseRevoke"}}
	waiter := lockerOn(t, newClient(t, eps, sw.dialOption()), WithRequestTimeout(timeout))
	ctx := context.Background()
	k := name("cleanup-without-answer")
	held, err := holder.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, k, opts(MinTTL, true))
		got <- err
	}()
	waitFor(t, "the waiter is queued", func() bool { return len(keysUnder(t, probe, k)) == 2 })
	sw.on.Store(true)
	start := time.Now()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: got %v, want context.Canceled", err)
	}
	deadline := start.Add(timeout + MinTTL + 2*time.Second)
	for len(keysUnder(t, probe, k)) > 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled waiter's key is still there %v later", time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireWithinContext: an acquisition whose put gets no answer returns
// when its ctx ends, not when the put's request timeout does
// (driver.ContextBounded), and the put, still unanswered at its own bound,
// gives up the session in the background.
func TestAcquireWithinContext(t *testing.T) {
	const timeout = 3 * time.Second
	eps := endpoints(t)
	sw := &swallower{methods: []string{"/etcdserverpb.KV/Txn"}}
	l := lockerOn(t, newClient(t, eps, sw.dialOption()), WithRequestTimeout(timeout))
	if !l.BoundedByContext() {
		t.Fatal("not ContextBounded")
	}
	k := name("within-context")
	// The session first, so that only the put is left to hang.
	first, err := l.Acquire(context.Background(), k, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	sess := first.(driver.SessionLease).Session()
	sw.on.Store(true)
	for _, wait := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		start := time.Now()
		_, err := l.Acquire(ctx, k, opts(MinTTL, wait))
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("wait %v: got %v, want context.DeadlineExceeded", wait, err)
		}
		if took > timeout/2 {
			t.Errorf("wait %v: returned %v after its ctx's 100ms, past half the request timeout %v", wait, took, timeout)
		}
	}
	select {
	case <-sess.Done():
	case <-time.After(2 * timeout):
		t.Error("the session was not given up after the unanswered put")
	}
}

// TestReleaseBlackholed cuts the holder off silently in the middle of its
// release: the release fails within the request timeout, and the key is gone
// within the session TTL of the cut (plus the leader's expiry tick and a
// margin), so the next contender is not blocked for good.
func TestReleaseBlackholed(t *testing.T) {
	const timeout = 500 * time.Millisecond
	eps := endpoints(t)
	p := drivertest.StartProxy(t, eps[0])
	l := lockerOn(t, newClient(t, []string{p.Addr()}), WithRequestTimeout(timeout))
	other, probe := newLocker(t, eps)
	ctx := context.Background()
	k := name("release-blackholed")
	held, err := l.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	cut := time.Now()
	if err := held.Release(ctx); !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Release through a blackhole: got %v, want ErrUnavailable", err)
	}
	if took := time.Since(cut); took > timeout+2*time.Second {
		t.Errorf("Release through a blackhole took %v", took)
	}
	deadline := cut.Add(MinTTL + 2*time.Second)
	for len(keysUnder(t, probe, k)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the key is still there %v after the cut", time.Since(cut))
		}
		time.Sleep(20 * time.Millisecond)
	}
	next, err := other.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatalf("Acquire after the blackholed release: %v", err)
	}
	if next.Token() <= held.Token() {
		t.Errorf("token %d after %d", next.Token(), held.Token())
	}
	next.Release(ctx)
}

// TestFrozenMemberAvoided gives the client two endpoints, and then makes
// the one the Locker uses swallow every byte, as a frozen member does: its
// connection stays open and answers nothing. The Locker must stop sending to
// it, so that no acquisition, release or keepalive fails for it. A client
// balancing over both would send it a share of every request, each failing
// after the request timeout.
func TestFrozenMemberAvoided(t *testing.T) {
	eps := endpoints(t)
	frozen := drivertest.StartProxy(t, eps[0])
	l := lockerOn(t, newClient(t, []string{frozen.Addr(), eps[0]}), WithRequestTimeout(3*time.Second))
	pinTo(l, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k := name("frozen-member")
	first, err := l.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatalf("first acquisition: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	frozen.Blackhole()
	for i := range 20 {
		lease, err := l.Acquire(ctx, k, opts(MinTTL, false))
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	// The session is kept alive by the member that answers.
	held, err := l.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	sess := held.(driver.SessionLease).Session()
	for range 2 {
		last := sess.Expiry()
		waitFor(t, "a keepalive is answered", func() bool { return sess.Expiry().After(last) })
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestKeepAliveNotHeldByFrozenHandshake moves the Locker, as an election
// does when the pinned member knows no leader, to a member it has not
// connected to yet and whose process is frozen: the kernel accepts the
// connection and nobody answers its handshake, so opening the session's
// keepalive stream there waits for as long as gRPC takes to connect (20s).
// The keepalive must not wait with it: the member's probe moves the Locker
// back, and the session must be renewed there before its lease can expire.
// Waiting in the open, it renewed nothing, and the waiters behind its keys
// sat on a free lock until the lease ran out on the server.
func TestKeepAliveNotHeldByFrozenHandshake(t *testing.T) {
	eps := endpoints(t)
	frozen := drivertest.StartProxy(t, eps[0])
	frozen.Blackhole()
	l := lockerOn(t, newClient(t, []string{eps[0], frozen.Addr()}))
	pinTo(l, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	held, err := l.Acquire(ctx, name("frozen-handshake"), opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	sess := held.(driver.SessionLease).Session()

	answering := l.members.pick()
	l.members.avoid(answering)
	if l.members.pick() == answering {
		t.Fatal("the Locker did not move to the frozen member")
	}
	// The first renewal may be the one in flight at the move; the second
	// was sent after it.
	for i := range 2 {
		last := sess.Expiry()
		for !sess.Expiry().After(last) {
			select {
			case <-sess.Done():
				t.Fatalf("renewal %d after the move: the session was lost", i+1)
			default:
			}
			if time.Now().After(last) {
				t.Fatalf("renewal %d after the move: none before the lease could expire at %s (the Locker is on %s, the frozen member %s)",
					i+1, last.Format("15:04:05.000"), l.members.pick().ep, frozen.Addr())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// pinTo has l send its requests to its client's i-th endpoint.
func pinTo(l *Locker, i int) *member {
	l.members.mu.Lock()
	defer l.members.mu.Unlock()
	l.members.pinned = l.members.member(i)
	return l.members.pinned
}

// freezeOnWatch runs freeze once, just before the first watch of a key
// under prefix is sent: the member froze between answering a contender's
// put and the creation of its watch.
type freezeOnWatch struct {
	clientv3.Watcher
	prefix string
	once   sync.Once
	freeze func()
}

func (w *freezeOnWatch) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	if strings.HasPrefix(key, w.prefix) {
		w.once.Do(w.freeze)
	}
	return w.Watcher.Watch(ctx, key, opts...)
}

// TestWaiterNotStalledByWatchOnFrozenMember: a waiter whose watch is
// created on a member that answers nothing must still be granted the lock
// once it is free. clientv3's Watch returns only once the member confirms
// the watch: a waiter waiting in it served neither its checks nor the
// Locker's move to another member, while its keepalive, moved on, kept its
// key first in line; the lock stayed free until the member came back.
func TestWaiterNotStalledByWatchOnFrozenMember(t *testing.T) {
	for _, tc := range []struct {
		name string
		// waiter returns the waiting Locker, and what freezes the proxy
		// once the waiter is queued behind the holder.
		waiter func(t *testing.T, proxy *drivertest.Proxy, k string) (*Locker, func())
	}{{
		name: "FrozeBeforeTheWatch",
		waiter: func(t *testing.T, proxy *drivertest.Proxy, k string) (*Locker, func()) {
			l := lockerOn(t, newClient(t, []string{proxy.Addr(), endpoints(t)[0]}))
			m := pinTo(l, 0)
			m.client.Watcher = &freezeOnWatch{Watcher: m.client.Watcher, prefix: KeyDir(k), freeze: proxy.Blackhole}
			return l, func() {}
		},
	}, {
		// The Locker left its member for the next one, frozen while its
		// connection looks ready, and the watch moved with it.
		name: "MovedOntoFrozenMember",
		waiter: func(t *testing.T, proxy *drivertest.Proxy, k string) (*Locker, func()) {
			l := lockerOn(t, newClient(t, []string{endpoints(t)[0], proxy.Addr()}))
			pinTo(l, 1)
			warm, err := l.Acquire(context.Background(), k+"-warm", opts(MinTTL, true))
			if err != nil {
				t.Fatal(err)
			}
			if err := warm.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			direct := pinTo(l, 0)
			return l, func() {
				proxy.Blackhole()
				l.members.avoid(direct) // as a probe of it that failed does
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			proxy := drivertest.StartProxy(t, endpoints(t)[0])
			k := name("frozen-watch")
			direct := newClient(t, endpoints(t)[:1])
			holder := lockerOn(t, direct)
			waiter, freeze := tc.waiter(t, proxy, k)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			held, err := holder.Acquire(ctx, k, opts(MinTTL, true))
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				le, err := waiter.Acquire(ctx, k, opts(MinTTL, true))
				if err == nil {
					le.Release(ctx)
				}
				got <- err
			}()
			waitFor(t, "the waiter's key", func() bool { return len(keysUnder(t, direct, k)) == 2 })
			freeze()
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// A check every third of the TTL, a probe and a move take
			// about a second; the member never comes back by itself.
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("waiter: %v", err)
				}
			case <-time.After(10 * time.Second):
				proxy.Reset()
				t.Fatalf("the lock stayed free for 10s while the waiter waited (its Locker on %s, the frozen member %s)",
					waiter.members.pick().ep, proxy.Addr())
			}
		})
	}
}

// TestRevocationWatchFollowsLocker: the session's watch of its revocation
// markers, moved with the Locker onto a member that answers nothing, must
// move on when the Locker leaves that member, so that a forced release is
// still reported to the holder.
func TestRevocationWatchFollowsLocker(t *testing.T) {
	eps := endpoints(t)
	proxy := drivertest.StartProxy(t, eps[0])
	k := name("frozen-revocation-watch")
	l := lockerOn(t, newClient(t, []string{eps[0], proxy.Addr()}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pinTo(l, 1)
	warm, err := l.Acquire(ctx, k+"-warm", opts(MinTTL, true))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	direct := pinTo(l, 0)
	held, err := l.Acquire(ctx, k, opts(3*MinTTL, true))
	if err != nil {
		t.Fatal(err)
	}
	told := make(chan struct{})
	held.(*lease).OnRevoke(func() { close(told) })
	proxy.Blackhole()
	l.members.avoid(direct) // onto the frozen member, as a probe of direct that failed does
	// The keepalive finds it silent and moves the Locker back.
	waitFor(t, "the Locker back on the member that answers", func() bool { return l.members.pick() == direct })
	if _, err := lockerOn(t, newClient(t, eps[:1])).ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-told:
	case <-time.After(10 * time.Second):
		t.Fatalf("a forced release not reported to its holder within 10s (its Locker on %s, the frozen member %s)",
			l.members.pick().ep, proxy.Addr())
	}
}

// TestSlowOnlyMemberKeepsSession: a single member that answers, but past the
// probe's patience, as one under load does, is waited for within each
// request's bound. Cutting its requests short, as is right for a member that
// froze while others answer, would leave nowhere to send them again, and a
// put cut short gives up its session with every lock on it.
func TestSlowOnlyMemberKeepsSession(t *testing.T) {
	slow := drivertest.StartProxy(t, endpoints(t)[0])
	l := lockerOn(t, newClient(t, []string{slow.Addr()}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ttl := 3 * MinTTL
	held, err := l.Acquire(ctx, name("slow-only-held"), opts(ttl, false))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	// Past probeAfter and probeTimeout together, within the request bound.
	delay := probeAfter + probeTimeout + 500*time.Millisecond
	slow.Slow(delay)
	start := time.Now()
	next, err := l.Acquire(ctx, name("slow-only-next"), opts(ttl, false))
	if err != nil {
		t.Fatalf("acquisition through a member answering %v late: %v", delay, err)
	}
	if took := time.Since(start); took < delay {
		t.Fatalf("the acquisition took %v, less than the member's delay %v: the delay was not in place", took, delay)
	}
	defer next.Release(context.Background())
	select {
	case <-held.(driver.SessionLease).Session().Done():
		t.Fatal("the session of a held lock ended while its only member answered late")
	default:
	}
	slow.Slow(0)
}

// TestSessionRevokedByOperator: once an operator revokes a session's etcd
// lease, the holder of a lock on it is told at the session's next request
// at the latest, and an acquisition that does not wait, made before the
// keepalive noticed, takes its lock on a new session rather than fail.
func TestSessionRevokedByOperator(t *testing.T) {
	eps := endpoints(t)
	l, c := newLocker(t, eps)
	ctx := context.Background()
	k := name("operator-revoked")
	held, err := l.Acquire(ctx, k, opts(60*time.Second, false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Revoke(ctx, held.(*lease).s.id); err != nil {
		t.Fatal(err)
	}
	next, err := l.Acquire(ctx, k+"/next", opts(60*time.Second, false))
	if err != nil {
		t.Fatalf("Acquire after the session's lease was revoked: %v", err)
	}
	defer next.Release(ctx)
	select {
	case <-held.(driver.SessionLease).Session().Done():
	case <-time.After(10 * time.Second):
		t.Error("the revoked session's holder was not told")
	}
	if next.(driver.SessionLease).Session() == held.(driver.SessionLease).Session() {
		t.Error("the lock was granted on the revoked session")
	}
}

// TestSessionStartNotStalledByFrozenWatch: a member that froze between
// answering a session's grant and confirming its watch of the session's
// revocation markers holds the acquisition no longer than a probe and a
// move to the next member, not for the request timeout.
func TestSessionStartNotStalledByFrozenWatch(t *testing.T) {
	proxy := drivertest.StartProxy(t, endpoints(t)[0])
	l := lockerOn(t, newClient(t, []string{proxy.Addr(), endpoints(t)[0]}), WithRequestTimeout(time.Minute))
	m := pinTo(l, 0)
	m.client.Watcher = &freezeOnWatch{Watcher: m.client.Watcher, prefix: RevokedPrefix, freeze: proxy.Blackhole}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	le, err := l.Acquire(ctx, name("frozen-session-watch"), opts(time.Minute, false))
	if err != nil {
		t.Fatalf("Acquire, its member frozen after the grant: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

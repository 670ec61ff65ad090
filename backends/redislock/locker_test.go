package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

const addrEnv, addrDefault = "WARDEN_REDIS_ADDR", "127.0.0.1:16379"

// newClient connects to the shared test server, as a separate process would.
func newClient(t testing.TB) *goredis.Client {
	t.Helper()
	addr := drivertest.Addr(t, addrEnv, addrDefault)
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// newLocker returns a Locker on c, closed when t ends.
func newLocker(t testing.TB, c goredis.UniversalClient, opts ...Option) *Locker {
	t.Helper()
	l, err := New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// newStore returns an idempotency store on c.
func newStore(t testing.TB, c goredis.UniversalClient, opts ...StoreOption) *Store {
	t.Helper()
	s, err := NewStore(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waiters counts the live waiters recorded for key: fair waiters and
// waiting writers.
func waiters(t testing.TB, c goredis.UniversalClient, key string) int {
	t.Helper()
	ctx := context.Background()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	min := strconv.FormatInt(now.UnixMilli(), 10)
	k := namesOf(key)
	n := 0
	for _, z := range []string{k.deadlines(), k.writeWaiters()} {
		c, err := c.ZCount(ctx, z, "("+min, "+inf").Result()
		if err != nil {
			t.Fatalf("ZCOUNT %s: %v", z, err)
		}
		n += int(c)
	}
	return n
}

func TestConformance(t *testing.T) {
	// silent is a Locker on a client that ends its calls by their
	// contexts' deadlines, on which it is DeadlineBounded.
	silent := func(t testing.TB) (*Locker, func()) {
		p := drivertest.StartProxy(t, drivertest.Addr(t, addrEnv, addrDefault))
		c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return newLocker(t, c), p.Blackhole
	}
	for _, fair := range []bool{false, true} {
		t.Run("fair="+strconv.FormatBool(fair), func(t *testing.T) {
			b := drivertest.Backend{
				NewLocker: func(t testing.TB) driver.Locker { return newLocker(t, newClient(t)) },
				FIFO:      fair,
			}
			if fair {
				probe := newClient(t)
				b.Waiters = func(t testing.TB, key string) int { return waiters(t, probe, key) }
			} else {
				b.Silence = func(t testing.TB) (driver.Locker, func()) { return silent(t) }
			}
			drivertest.Run(t, b)
		})
	}
	// The suite asks for fair mode only in its FIFO and cancellation tests;
	// this run sends every acquisition through the queue, so mutual
	// exclusion, expiry and wake-ups are proven for fair mode too.
	t.Run("fair=always", func(t *testing.T) {
		probe := newClient(t)
		drivertest.Run(t, drivertest.Backend{
			NewLocker: func(t testing.TB) driver.Locker { return alwaysFair{newLocker(t, newClient(t))} },
			FIFO:      true,
			Waiters:   func(t testing.TB, key string) int { return waiters(t, probe, key) },
			Silence: func(t testing.TB) (driver.Locker, func()) {
				l, silence := silent(t)
				return alwaysFair{l}, silence
			},
		})
	})
}

// alwaysFair is a Locker that asks for fair mode on every acquisition.
type alwaysFair struct{ l *Locker }

func (f alwaysFair) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	opts.Fair = true
	return f.l.Acquire(ctx, key, opts)
}

func (f alwaysFair) BoundedByDeadline() bool { return f.l.BoundedByDeadline() }

// TestRefreshBatch: one pipelined call refreshes every kind of lease; a lost
// lease and one from another Locker get their own errors.
func TestRefreshBatch(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	l, other := newLocker(t, c), newLocker(t, newClient(t))
	base := fmt.Sprintf("batch/%d", time.Now().UnixNano())
	short := driver.AcquireOptions{TTL: 300 * time.Millisecond}
	var leases []driver.Lease
	add := func(ls driver.Lease, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, ls)
	}
	add(l.Acquire(ctx, base+"/mutex", short))
	add(l.AcquireRead(ctx, base+"/rw", short))
	add(l.AcquireWrite(ctx, base+"/rw2", short))
	add(l.AcquireSemaphore(ctx, base+"/sem", 2, short))
	add(other.Acquire(ctx, base+"/foreign", short))
	lost, err := l.Acquire(ctx, base+"/lost", short)
	if err != nil {
		t.Fatal(err)
	}
	if err := lost.Release(ctx); err != nil {
		t.Fatal(err)
	}
	leases = append(leases, lost)

	errs := l.RefreshBatch(ctx, leases, time.Minute)
	for i, err := range errs[:4] {
		if err != nil {
			t.Errorf("lease %d: %v", i, err)
		}
	}
	if !errors.Is(errs[4], driver.ErrInvalidOption) {
		t.Errorf("foreign lease: got %v, want ErrInvalidOption", errs[4])
	}
	if !errors.Is(errs[5], driver.ErrNotHeld) {
		t.Errorf("released lease: got %v, want ErrNotHeld", errs[5])
	}
	// Past the original 300ms TTL (a lower bound: a slower machine only
	// waits longer), the refreshed lock still keeps others out.
	time.Sleep(600 * time.Millisecond)
	if _, err := other.Acquire(ctx, base+"/mutex", short); !errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("after the batch refresh: got %v, want ErrNotAcquired", err)
	}
	for _, ls := range leases[:5] {
		ls.Release(ctx)
	}
}

func TestKeysShareOneHashTag(t *testing.T) {
	k := namesOf("a{b}c%7B/:é")
	want := "{a%7Bb%7Dc%257B/:é}"
	for _, name := range []string{k.lock(), k.fence(), k.queue(), k.deadlines(), k.readers(), k.writer(), k.writeWaiters(), k.permits(), k.channel()} {
		if !strings.HasPrefix(name, want) {
			t.Errorf("%q does not start with %q", name, want)
		}
	}
	if namesOf("a{b}").lock() == namesOf("a%7Bb%7D").lock() {
		t.Error("two keys encode to one")
	}
	for _, key := range []string{"a{b}c%7B/:é", "", "plain", "{", "}{"} {
		n, m := namesOf(key), mutexNamesOf(key)
		want := mutexNames{n.lock(), n.queue(), n.deadlines(), n.waiters(), n.channel()}
		p := plainReleaseOf(key, "OWNER/x:0:", 1764228000123456, 20420)
		if p.lock != n.lock() || p.waiters != n.waiters() || p.free != "0:1764228000123456:20420:0:" || p.mine != ":1764228000123456:20420:0:OWNER/x:0:" {
			t.Errorf("plainReleaseOf(%q) = %q, want %q and %q, and the states", key, *p, n.lock(), n.waiters())
		}
		if m != want || lockKeyOf(key) != n.lock() {
			t.Errorf("mutexNamesOf(%q) = %q, lockKeyOf %q; want %q", key, m, lockKeyOf(key), want)
		}
	}
}

// TestWaitReplicasUnmet: the test server has no replica, so WAIT 1 times out
// with none acknowledging; the acquisition fails and leaves no lock behind.
func TestWaitReplicasUnmet(t *testing.T) {
	ctx := context.Background()
	key := fmt.Sprintf("wait-replicas/%d", time.Now().UnixNano())
	l := newLocker(t, newClient(t), WithWaitReplicas(1, 50*time.Millisecond))
	if _, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); !errors.Is(err, driver.ErrUnavailable) ||
		!strings.Contains(err.Error(), "the master has 0 connected replicas") {
		t.Fatalf("Acquire with an unmet WAIT on a master without replicas: got %v, want ErrUnavailable naming the cause", err)
	}
	lease, err := newLocker(t, newClient(t)).Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatalf("the failed acquisition left its lock: %v", err)
	}
	lease.Release(ctx)
	if _, err := New(newClient(t), WithWaitReplicas(0, time.Second)); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("WithWaitReplicas(0): got %v, want ErrInvalidOption", err)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("New(nil): %v, want ErrInvalidOption", err)
	}
	if _, err := New(newClient(t), WithWaiterTimeout(time.Millisecond)); !errors.Is(err, driver.ErrInvalidOption) ||
		!strings.Contains(err.Error(), "waiter timeout") {
		t.Errorf("WithWaiterTimeout(1ms): %v, want ErrInvalidOption naming the waiter timeout", err)
	}
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	if _, err := New(ring, WithWaitReplicas(1, time.Second)); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("WithWaitReplicas on a Ring: %v, want ErrUnsupported", err)
	}
	if _, err := NewStore(nil); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("NewStore(nil): %v, want ErrInvalidOption", err)
	}
}

// Ten thousand locks with a 3s ttl, renewed through one Guard while other
// processes load the machine: none is lost.
func TestHoldManyUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 10,000 locks for 6s")
	}
	drivertest.HoldMany(t, newLocker(t, newClient(t)), 10_000, 3*time.Second, 6*time.Second)
}

// TestReleaseWakesTheWaiterOnItsLockersChannel: a release wakes the waiter
// it names, fair or not, through the channel of the waiter's own Locker,
// which nobody else listens to, so the waiter gets the lock long before its
// own timers would have it try again (the holder's TTL of 30s, the renewal
// of its place every 20s), and no process listens on the lock's channel.
func TestReleaseWakesTheWaiterOnItsLockersChannel(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			holderClient, waiterClient := newClient(t), newClient(t)
			holder := newLocker(t, holderClient)
			waiter := newLocker(t, waiterClient, WithWaiterTimeout(time.Minute))
			ctx := context.Background()
			key := "wake-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			opts := driver.AcquireOptions{TTL: 30 * time.Second, Wait: true, Fair: fair}
			held, err := holder.Acquire(ctx, key, opts)
			if err != nil {
				t.Fatal(err)
			}
			granted := make(chan error, 1)
			go func() {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				le, err := waiter.Acquire(wctx, key, opts)
				if err == nil {
					err = le.Release(ctx)
				}
				granted <- err
			}()
			// Recorded and subscribed: its Locker's channel has a listener.
			deadline := time.Now().Add(10 * time.Second)
			for {
				n, err := holderClient.PubSubNumSub(ctx, waiter.wake).Result()
				if err != nil {
					t.Fatal(err)
				}
				if n[waiter.wake] == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the waiter's Locker never subscribed to its channel")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if n, err := holderClient.PubSubNumSub(ctx, namesOf(key).channel()).Result(); err != nil || n[namesOf(key).channel()] != 0 {
				t.Fatalf("listeners on the lock's channel: %v, %v; want none", n, err)
			}
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-granted; err != nil {
				t.Fatalf("the waiter, woken by the release: %v", err)
			}
		})
	}
}

// TestUnansweredGrantIsFound: an attempt cut short without an answer may
// have taken the lock; a later attempt of the same contender finds the
// lock its own, with the token the lost attempt drew and its lease
// renewed, fair or not. It need not be told so: a release may have handed
// the lock to it, or, fair, reserved it for it (see release.lua); a
// non-fair one told so finds it all the same.
func TestUnansweredGrantIsFound(t *testing.T) {
	c := newClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			n := namesOf("unanswered-" + strconv.FormatInt(time.Now().UnixNano(), 36))
			const owner, token = "lost-attempt-owner", 4242
			now, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			held := fmt.Sprintf("%d:%d:%d:0:%s", now.Add(time.Second).UnixMilli(), token, now.UnixMilli()/86400000+2, owner)
			if err := c.Set(ctx, n.lock(), held, 24*time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			attempt := func(unanswered bool) reply {
				t.Helper()
				place := "60000:" + l.wake + "\n" + owner
				var r reply
				var err error
				if fair {
					r, err = run(ctx, l.sc, l.s.fairAcquire, []string{n.lock(), n.queue(), n.deadlines()},
						owner, 30000, "1", 60000, 250, n.channel(), place)
				} else {
					r, err = run(ctx, l.sc, l.s.acquire, []string{n.lock(), n.waiters()},
						owner, 30000, "1", "60000\n"+l.wake+"\n"+owner, flag(unanswered))
				}
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			if r := attempt(false); r[0] != 1 || r[1] != token {
				t.Fatalf("an attempt not told of a lost answer: %v, want {1, %d}", r, token)
			}
			if r := attempt(true); !fair && (r[0] != 1 || r[1] != token) {
				t.Fatalf("an attempt told of a lost answer: %v, want {1, %d}", r, token)
			}
			in, err := l.Inspect(ctx, strings.TrimSuffix(strings.TrimPrefix(n.tag, "{"), "}"))
			if err != nil || len(in.Holders) != 1 || in.Holders[0].TTL < 20*time.Second {
				t.Fatalf("the lock after it was found: %+v, %v; want it renewed to 30s", in, err)
			}
			for _, k := range []string{n.waiters(), n.queue(), n.deadlines()} {
				if ex, err := c.Exists(ctx, k).Result(); err != nil || ex != 0 {
					t.Fatalf("%s left behind: %d, %v", k, ex, err)
				}
			}
			c.Del(ctx, n.lock())
		})
	}
}

// TestBoundedByDeadline: the Locker and the idempotency Store declare
// driver.DeadlineBounded only over a client whose every call ends by its
// context's deadline.
func TestBoundedByDeadline(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client goredis.UniversalClient
		opts   []Option
		want   bool
	}{
		{"default options", goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), nil, false},
		{"ContextTimeoutEnabled", goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}), nil, true},
		{"ContextTimeoutEnabled, no read deadline", goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, ReadTimeout: -2}), nil, false},
		{"ContextTimeoutEnabled, no write deadline", goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, WriteTimeout: -2}), nil, false},
		{"ContextTimeoutEnabled, no timeouts but the context's", goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, ReadTimeout: -1, WriteTimeout: -1}), nil, true},
		{"Cluster, ContextTimeoutEnabled", goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true}), nil, false},
		{"Ring, ContextTimeoutEnabled", goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true}), nil, false},
		{"ContextTimeoutEnabled, WithWaitReplicas", goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}), []Option{WithWaitReplicas(1, time.Second)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { tc.client.Close() })
			if got := newLocker(t, tc.client, tc.opts...).BoundedByDeadline(); got != tc.want {
				t.Errorf("Locker: %v, want %v", got, tc.want)
			}
			if tc.opts == nil {
				if got := newStore(t, tc.client).BoundedByDeadline(); got != tc.want {
					t.Errorf("Store: %v, want %v", got, tc.want)
				}
			}
		})
	}
}

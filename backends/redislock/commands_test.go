package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// serverCalls sums the calls of every command in INFO commandstats, the
// commands scripts run included, less the INFO calls themselves.
func serverCalls(t testing.TB, c *goredis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for f := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				calls[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return calls
}

// commandsPer runs op n times on a server of the test's own and returns the
// server commands one run cost, by command.
func commandsPer(t *testing.T, c *goredis.Client, n int, op func()) (total float64, by map[string]float64) {
	t.Helper()
	op() // the scripts are loaded, the keys made
	before := serverCalls(t, c)
	for range n {
		op()
	}
	after := serverCalls(t, c)
	by = map[string]float64{}
	for name, v := range after {
		if d := v - before[name]; d > 0 && name != "info" {
			by[name] = float64(d) / float64(n)
			total += by[name]
		}
	}
	return total, by
}

// TestUncontendedCycleCommands: an uncontended acquisition and release of
// a plain lock cost 5 server commands (the two scripts and, inside them,
// the grant's TIME and each one's SET), however many times the key is
// used; a refresh costs 3. The commands are counted by the server itself.
func TestUncontendedCycleCommands(t *testing.T) {
	c, _ := privateClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}
	total, by := commandsPer(t, c, 100, func() {
		lease, err := l.Acquire(ctx, "cycle", opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("server commands per cycle: %v %v", total, by)
	if total != 5 {
		t.Errorf("server commands per uncontended cycle: %v (%v), want 5", total, by)
	}
	lease, err := l.Acquire(ctx, "refreshed", opts)
	if err != nil {
		t.Fatal(err)
	}
	total, by = commandsPer(t, c, 100, func() {
		if err := lease.Refresh(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	if total != 3 {
		t.Errorf("server commands per refresh: %v (%v), want 3", total, by)
	}
}

// TestIdempotencyStoreCommands: a first request (claim, complete) costs 8
// server commands and a replay (get) 2, counted by the server itself.
func TestIdempotencyStoreCommands(t *testing.T) {
	c, _ := privateClient(t)
	s := newStore(t, c)
	ctx := context.Background()
	i := 0
	total, by := commandsPer(t, c, 50, func() {
		i++
		key, owner := "req-"+strconv.Itoa(i), "owner-"+strconv.Itoa(i)
		rec, err := s.Claim(ctx, idempotency.Claim{Scope: "s", Key: key, Fingerprint: "f", Owner: owner, Lease: time.Minute})
		if err != nil || rec != nil {
			t.Fatalf("claim: %v, %v", rec, err)
		}
		if err := s.Complete(ctx, "s", key, owner, []byte("done"), time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	if total != 8 {
		t.Errorf("server commands per first request: %v (%v), want 8", total, by)
	}
	total, by = commandsPer(t, c, 50, func() {
		rec, err := s.Get(ctx, "s", "req-1")
		if err != nil || string(rec.Response) != "done" {
			t.Fatalf("get: %+v, %v", rec, err)
		}
	})
	if total != 2 {
		t.Errorf("server commands per replay: %v (%v), want 2", total, by)
	}
}

// TestEarlierFormatLockIsHeld: a lock an earlier warden took (its owner id,
// with PX) is found held, plain or fair, and left exactly as it was, its
// expiry included, so that its holder's own release and refresh still work.
func TestEarlierFormatLockIsHeld(t *testing.T) {
	c := newClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	for _, fair := range []bool{false, true} {
		key := "earlier-format-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		lock := namesOf(key).lock()
		if err := c.Set(ctx, lock, "earlier-owner", 5*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Second, Fair: fair})
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("fair=%v: acquiring a lock held in the earlier format: %v, want ErrNotAcquired", fair, err)
		}
		if v, err := c.Get(ctx, lock).Result(); err != nil || v != "earlier-owner" {
			t.Fatalf("fair=%v: the earlier lock after the attempt: %q, %v", fair, v, err)
		}
		if pttl := c.PTTL(ctx, lock).Val(); pttl <= 3*time.Second || pttl > 5*time.Second {
			t.Fatalf("fair=%v: the earlier lock's PTTL after the attempt: %v, want its own", fair, pttl)
		}
		c.Del(ctx, lock)
	}
}

// TestWaitingFlagKept: the flag by which a waiter announced itself in the
// lock's state survives the holder's refresh and a grant to another
// contender, fair waiter ('2') or not ('1'), so that the release that
// follows looks for the waiters.
func TestWaitingFlagKept(t *testing.T) {
	c := newClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	flagOf := func(key string) string {
		t.Helper()
		v, err := c.Get(ctx, namesOf(key).lock()).Result()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Split(v, ":")
		if len(f) < 5 {
			t.Fatalf("state %q", v)
		}
		return f[3]
	}
	for _, flag := range []string{"1", "2"} {
		key := "waiting-flag-" + flag + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		n := namesOf(key)
		t.Cleanup(func() { c.Del(ctx, n.lock(), n.queue(), n.deadlines(), n.waiters()) })
		holder, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		// A waiter's failed attempt announces it.
		if flag == "2" {
			place := "60000:" + l.wake + "\nfair-waiter"
			_, err = run(ctx, l.sc, l.s.fairAcquire, []string{n.lock(), n.queue(), n.deadlines()},
				"fair-waiter", 10000, "1", 60000, 250, n.channel(), place)
		} else {
			_, err = run(ctx, l.sc, l.s.acquire, []string{n.lock(), n.waiters()},
				"waiter", 10000, "1", "60000\n"+l.wake+"\nwaiter", "0")
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := flagOf(key); got != flag {
			t.Fatalf("flag after the waiter's attempt: %q, want %q", got, flag)
		}
		if err := holder.Refresh(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if got := flagOf(key); got != flag {
			t.Fatalf("flag after the holder's refresh: %q, want %q", got, flag)
		}
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got := flagOf(key); got != flag {
			t.Fatalf("flag after the release, the waiter still waiting: %q, want %q", got, flag)
		}
		next, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: 10 * time.Second})
		if err != nil {
			if flag == "2" && errors.Is(err, driver.ErrNotAcquired) {
				continue // the fair queue's head has its turn
			}
			t.Fatal(err)
		}
		if got := flagOf(key); got != flag {
			t.Fatalf("flag after a grant to a contender that did not wait: %q, want %q", got, flag)
		}
		next.Release(ctx)
	}
}

// TestWaiterRecordsExpiry: the waiters' records of a lock expire with their
// sorted set, which outlasts every record in it by up to a timeout more, so
// that the records that follow within a timeout cost no PEXPIRE.
func TestWaiterRecordsExpiry(t *testing.T) {
	c, _ := privateClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	holder, err := l.Acquire(ctx, "held", driver.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	n := namesOf("held")
	const timeout = 60_000
	before := serverCalls(t, c)
	for i := range 3 {
		owner := "waiter-" + strconv.Itoa(i)
		r, err := run(ctx, l.sc, l.s.acquire, []string{n.lock(), n.waiters()}, owner, 10000, "1", strconv.Itoa(timeout)+"\n"+l.wake+"\n"+owner, "0")
		if err != nil || r[0] != 0 {
			t.Fatalf("a waiter's attempt on a held lock: %v, %v", r, err)
		}
		pttl := c.PTTL(ctx, n.waiters()).Val()
		if pttl <= timeout*time.Millisecond || pttl > 2*timeout*time.Millisecond {
			t.Fatalf("the records' PTTL %v after record %d, want more than the timeout (%dms), twice at most", pttl, i, timeout)
		}
	}
	if got := serverCalls(t, c)["pexpire"] - before["pexpire"]; got != 1 {
		t.Errorf("%d PEXPIREs for 3 records within a timeout, want 1", got)
	}
}

// TestScriptCacheFlushed: after the server lost its script cache (a
// restart, SCRIPT FLUSH), a plain lock's acquisition and release, whose
// commands the Locker builds itself, send each script's body once, and
// work.
func TestScriptCacheFlushed(t *testing.T) {
	c, _ := privateClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: 10 * time.Second, Wait: true}
	cycle := func() {
		t.Helper()
		lease, err := l.Acquire(ctx, "flushed", opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle()
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := serverCalls(t, c)
	cycle()
	cycle()
	after := serverCalls(t, c)
	if n := after["eval"] - before["eval"]; n != 2 {
		t.Errorf("%d scripts sent in full after the flush, want 2 (the acquisition's and the release's, once)", n)
	}
}

// TestRefreshBatchChunks: on a single server, a batch extends plain locks
// with one script call per chunk of refreshChunk leases, not one per
// lease; a lease lost meanwhile, in any chunk, is told apart from the
// rest; after SCRIPT FLUSH each chunk is sent in full once.
func TestRefreshBatchChunks(t *testing.T) {
	c, _ := privateClient(t)
	l := newLocker(t, c)
	ctx := context.Background()
	const n = refreshChunk + 10
	short := driver.AcquireOptions{TTL: 5 * time.Second}
	leases := make([]driver.Lease, n)
	for i := range leases {
		var err error
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("chunk/%d", i), short); err != nil {
			t.Fatal(err)
		}
	}
	// One lost lease in each chunk: released, and taken over.
	lost := map[int]bool{3: true, refreshChunk + 4: true}
	for i := range lost {
		if err := leases[i].Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Acquire(ctx, fmt.Sprintf("chunk/%d", i), short); err != nil {
			t.Fatal(err)
		}
	}
	l.RefreshBatch(ctx, leases, time.Minute) // the script cached on the server
	for _, flush := range []bool{false, true} {
		if flush {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		before := serverCalls(t, c)
		start := time.Now()
		errs := l.RefreshBatch(ctx, leases, time.Minute)
		after := serverCalls(t, c)
		for i, err := range errs {
			switch {
			case lost[i] && !errors.Is(err, driver.ErrNotHeld):
				t.Errorf("flush %v: lost lease %d: got %v, want ErrNotHeld", flush, i, err)
			case !lost[i] && err != nil:
				t.Errorf("flush %v: lease %d: %v", flush, i, err)
			case !lost[i] && leases[i].Expiry().Before(start.Add(50*time.Second)):
				t.Errorf("flush %v: lease %d expires at %v, want about a minute after %v", flush, i, leases[i].Expiry(), start)
			}
		}
		wantEval := int64(0)
		if flush {
			wantEval = 2
		}
		if got := after["evalsha"] - before["evalsha"]; got != 2 {
			t.Errorf("flush %v: %d EVALSHAs for %d leases, want 2 (one per chunk)", flush, got, n)
		}
		if got := after["eval"] - before["eval"]; got != wantEval {
			t.Errorf("flush %v: %d EVALs, want %d", flush, got, wantEval)
		}
	}
	// The extension is the server's: the states' deadlines are a minute
	// past the server's clock, not 5s.
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, refreshChunk + 9} {
		state, err := c.Get(ctx, lockKeyOf(fmt.Sprintf("chunk/%d", i))).Result()
		if err != nil {
			t.Fatal(err)
		}
		deadline, _, _ := strings.Cut(state, ":")
		ms, err := strconv.ParseInt(deadline, 10, 64)
		if err != nil || ms < now.Add(50*time.Second).UnixMilli() {
			t.Errorf("lock %d: state %q, want a deadline about a minute after the server's %v", i, state, now)
		}
	}
}

// answers is a go-redis hook that counts the commands the server answered,
// so that a test knows when an acquisition waiting on another goroutine has
// made its attempt.
type answers struct{ n atomic.Int64 }

func (h *answers) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *answers) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		h.n.Add(1)
		return err
	}
}

func (h *answers) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// commandsOf runs f and returns the server commands it cost, by command,
// less the PINGs of the Pub/Sub connections' health checks (sent after a
// second of silence, which a loaded machine can make), which are no
// acquisition's.
func commandsOf(t *testing.T, c *goredis.Client, f func()) (total int64, by map[string]int64) {
	t.Helper()
	before := serverCalls(t, c)
	f()
	by = map[string]int64{}
	for name, v := range serverCalls(t, c) {
		if d := v - before[name]; d > 0 && name != "info" && name != "ping" {
			by[name] = d
			total += d
		}
	}
	return total, by
}

// TestFairHandoffCommands: the server commands of each step of a fair
// handoff, counted by the server itself. A waiter queued behind the holder
// costs 7 (EVALSHA, TIME, GET, ZRANGEBYSCORE, ZADD, RPUSH and a PTTL of the
// deadlines, whose expiry the list's follows), and the first one 3 more:
// the queue keys' expiry, which lasts twice the waiter timeout so that the
// next ones within a timeout need none, and the waiting flag in the lock's
// state. The holder's release, which reserves the lock for the head of the
// queue and wakes it, costs 7 (EVALSHA, SET GET, TIME, LINDEX, ZSCORE, the
// reservation's SET, PUBLISH), and the head's claim 6 (EVALSHA, TIME, GET,
// the SET that extends the reservation, LREM, ZREM): the head finds the
// lock its own, and reads nothing of the queue. The release of a grant
// that found the queue announced, as the head's does, looks for the next
// head before it writes, and writes the reservation in its SET GET: 6
// (EVALSHA, TIME, LINDEX, ZSCORE, SET GET, PUBLISH), with the next claim's
// 6. The releaser coming straight back is queued with the clock its
// release answered, and reads no TIME: 8 as the first waiter (EVALSHA,
// GET, ZRANGEBYSCORE, ZADD, RPUSH, PTTL, and the queue keys' expiry).
func TestFairHandoffCommands(t *testing.T) {
	c, addr := privateClient(t)
	ctx := context.Background()
	opts := driver.AcquireOptions{TTL: time.Minute, Wait: true, Fair: true}
	locker := func() (*Locker, *answers) {
		cl := goredis.NewClient(&goredis.Options{Addr: addr})
		t.Cleanup(func() { cl.Close() })
		h := &answers{}
		cl.AddHook(h)
		// With a waiter timeout of a minute, no waiter comes back by
		// itself to renew its place while the commands are counted.
		return newLocker(t, cl, WithWaiterTimeout(time.Minute)), h
	}
	holder, _ := locker()
	a, aAnswers := locker()
	b, bAnswers := locker()
	key := "fair-handoff"
	type result struct {
		lease driver.Lease
		err   error
	}
	// wait starts a waiting acquisition by l, and returns once its first
	// attempt was answered.
	wait := func(l *Locker, h *answers) <-chan result {
		done := make(chan result, 1)
		before := h.n.Load()
		go func() {
			le, err := l.Acquire(ctx, key, opts)
			done <- result{le, err}
		}()
		eventually(t, "a waiter's first attempt", func() bool { return h.n.Load() > before })
		return done
	}
	acquired := func(done <-chan result) driver.Lease {
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.lease
	}
	// The first round loads the scripts and subscribes each waiter's
	// Locker, which the second round finds done.
	for round := range 2 {
		// No Locker comes back from a release of its own made a
		// moment before, but where the round says so.
		for _, l := range []*Locker{holder, a, b} {
			l.handedOff.Store(nil)
		}
		held, err := holder.Acquire(ctx, key, opts)
		if err != nil {
			t.Fatal(err)
		}
		var aDone, bDone <-chan result
		first, by1 := commandsOf(t, c, func() { aDone = wait(a, aAnswers) })
		next, by2 := commandsOf(t, c, func() { bDone = wait(b, bAnswers) })
		var aLease driver.Lease
		handoff, by3 := commandsOf(t, c, func() {
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			aLease = acquired(aDone)
		})
		var bLease driver.Lease
		handon, by4 := commandsOf(t, c, func() {
			if err := aLease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			bLease = acquired(bDone)
		})
		var aAgain <-chan result
		back, by5 := commandsOf(t, c, func() { aAgain = wait(a, aAnswers) })
		if err := bLease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := acquired(aAgain).Release(ctx); err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			continue
		}
		t.Logf("first waiter %d %v; next %d %v; release and claim %d %v; the next %d %v; back %d %v",
			first, by1, next, by2, handoff, by3, handon, by4, back, by5)
		if first != 10 || next != 7 || handoff != 13 || handon != 12 || back != 8 {
			t.Errorf("server commands: first waiter %d (%v), next %d (%v), release and claim %d (%v), the next %d (%v), back %d (%v); want 10, 7, 13, 12 and 8",
				first, by1, next, by2, handoff, by3, handon, by4, back, by5)
		}
	}
}

package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/redisrefusal"
	"github.com/warden-go/warden/guard/driver"
)

// waiter describes how to contend for one kind of lease.
type waiter struct {
	// id names a fair waiter, whom a release message can address; "" for a
	// waiter that any release may wake.
	id string
	// keepAlive, when set, is how often a waiting contender comes back to
	// renew its recorded place (fair queue, waiting writer).
	keepAlive time.Duration
	// shared: after this waiter gets in, the next local waiter may too
	// (readers), so the wake-up is passed on.
	shared bool
	// bounded: a waiting attempt may be cut short after attemptBound,
	// since the next one finds the lock if the unanswered one took it.
	bounded bool
	// flight is the room of its attempts on the watchdog, when the
	// contender keeps one; otherwise each bounded attempt makes its own.
	flight *flight
	contender
}

// contender makes the attempts of one acquisition.
type contender interface {
	// attempt runs the acquisition script once; queued asks it to record
	// the contender as waiting when it fails. It answers {1, token} or
	// {0, ms until the blocking lease lapses (negative when unknown)}.
	attempt(ctx context.Context, sc goredis.Scripter, queued bool) (reply, error)
	// cleanup removes whatever an interrupted wait may have left on the
	// server (a queued place, a lock granted after ctx ended), and says
	// whether the server did. Made again, it changes nothing more.
	cleanup(ctx context.Context) error
}

// funcs is a contender made of two functions, for the acquisitions off the
// plain lock's path.
type funcs struct {
	try   func(ctx context.Context, sc goredis.Scripter, queued bool) (reply, error)
	clean func(ctx context.Context) error
}

func (f *funcs) attempt(ctx context.Context, sc goredis.Scripter, queued bool) (reply, error) {
	return f.try(ctx, sc, queued)
}

func (f *funcs) cleanup(ctx context.Context) error { return f.clean(ctx) }

// maxUnreachablePause caps the pause of a waiting acquisition between
// attempts on a server that does not answer. The lock comes back only when a
// waiter's attempt reaches the server again, and nothing tells a waiter when
// that is: with pauses of up to a second (the default), the first waiter
// came back up to that long after the new master of a failover was serving.
// An attempt on a refused connection costs next to nothing.
const maxUnreachablePause = 250 * time.Millisecond

// cleanupTimeout bounds the best-effort cleanup after a failed acquisition.
const cleanupTimeout = 2 * time.Second

// cleanupTry bounds the first try of a cleanup on the caller's goroutine
// over a client bounded by its context's deadline (see
// Locker.BoundedByDeadline), whose caller guard does not watch: a healthy
// server answers it well within, and the acquisition returns within
// guard's grace past its bound. Over any other client the try has
// cleanupTimeout: guard has stopped waiting for the call at its bound
// already.
const cleanupTry = 10 * time.Millisecond

// cleanUp runs f, the cleanup an acquisition that failed leaves to do
// whether or not its caller still waits: first on the caller's goroutine
// when the server answered the latest attempt (answered), so that the
// record is gone when the acquisition returns (a process that closes its
// client, or exits, right after a timed-out Lock leaves none for a release
// to hand the lock to, which would then stay with nobody for a whole TTL);
// and when that did not succeed, or the server was not answering, on a
// goroutine of its own within cleanupTimeout. A server that does not
// answer would only hold the caller past its bound: the last attempt guard
// keeps from a bounded wait, to tell a lock held from a server out of
// reach, would then find no time left; and a client with go-redis's
// default options, which ignores the try's deadline, would hold it for its
// read timeout. f is the same either time, and a second run changes
// nothing the first one did.
//
// An attempt that got no answer may reach the server after the cleanup
// did: a request held up on the network (a lost segment is sent again
// 200ms or more later) while the cleanup went on another connection. It
// then takes the lock, if free, for an owner that nobody holds any longer,
// until the lease's TTL runs out. So after such an attempt the cleanup
// runs again after pauses of cleanupAgain, four and sixteen times that
// (about 250ms, 1.25s and 5.25s after the first run), whether or not a run
// got an answer: a run that failed, in a partition whose end lets the held
// up request through first, would otherwise be the last. What the late
// attempt took is given back within those pauses of its arrival, and a
// request held up longer than them all still holds its lock for a TTL.
// At most maxCleanupsAgain cleanups of a Locker run again at a time: a
// server slow enough to leave many attempts unanswered would otherwise get
// three more runs of each of their cleanups, and the Locker a goroutine
// each for seconds; those past it run once, as every cleanup did before.
// Close cuts the pauses short: each cleanup still to run again runs once
// more at once, and Close waits for those runs, and for the first runs
// under way (see cleanups), so that they run while the caller's client is
// still open and no goroutine of theirs outlives Close; a cleanup that
// starts after Close runs once.
func (l *Locker) cleanUp(ctx context.Context, f func(context.Context) error, answered bool) {
	base := context.WithoutCancel(ctx)
	if answered {
		try := cleanupTimeout
		if l.BoundedByDeadline() {
			try = cleanupTry
		}
		tctx, cancel := context.WithTimeout(base, try)
		err := f(tctx)
		cancel()
		if err == nil {
			return
		}
	}
	l.cleanups.start()
	go func() {
		again := false
		defer func() { l.cleanups.end(again) }()
		run := func() {
			cctx, cancel := context.WithTimeout(base, cleanupTimeout)
			defer cancel()
			_ = f(cctx)
		}
		run()
		if answered || !l.cleanups.takeAgain() {
			return
		}
		again = true
		for pause := cleanupAgain; pause <= 16*cleanupAgain; pause *= 4 {
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-l.notify.closed:
				t.Stop()
				run()
				return
			}
			run()
		}
	}()
}

// cleanups counts the cleanups of a Locker that run on goroutines of
// their own (see cleanUp), and those of them that run again, and lets
// Close wait for them.
type cleanups struct {
	mu sync.Mutex
	// live counts the goroutines, again those of them running again.
	live, again int
	closed      bool
	// idle, once Close waits, is closed by the last to end.
	idle chan struct{}
}

// start counts a cleanup's goroutine in.
func (c *cleanups) start() {
	c.mu.Lock()
	c.live++
	c.mu.Unlock()
}

// takeAgain reports whether a cleanup may run again, and counts it if so:
// not past maxCleanupsAgain, nor after Close.
func (c *cleanups) takeAgain() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.again >= maxCleanupsAgain {
		return false
	}
	c.again++
	return true
}

// end counts a cleanup's goroutine out; again says it was running again.
func (c *cleanups) end(again bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live--
	if again {
		c.again--
	}
	if c.live == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

// close refuses any more runs again and waits for the cleanups under way
// (a first run, or a last one) to end, at most within: a server that does
// not answer them must not hold Close much longer than it would hold one
// run.
func (c *cleanups) close(within time.Duration) {
	c.mu.Lock()
	c.closed = true
	if c.live == 0 {
		c.mu.Unlock()
		return
	}
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	idle := c.idle
	c.mu.Unlock()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}

// maxCleanupsAgain bounds the cleanups of a Locker that run again at a
// time (see cleanUp).
const maxCleanupsAgain = 16

// cleanupAgain is the first pause after which the cleanup of an
// acquisition whose latest attempt got no answer runs again (see
// cleanUp): past a retransmission of a lost segment (Linux's least
// retransmission timeout is 200ms).
const cleanupAgain = 250 * time.Millisecond

// attemptBound cuts short a waiting attempt (of a bounded waiter) that has
// no answer yet, a boundTick later at most (see watchdog). After a Cluster
// failover, the client goes on dialing the dead master's address for the
// slot, five times a tenth of a second apart
// with go-redis's defaults, and again on each of its retries, before it
// uses the new slot map: an attempt started just before the promotion would
// hold the first grant back by a second or more. Cut short, the attempt
// ends as unavailable, the slot map is reloaded (see scripter), and the
// next attempt goes to the new master. With go-redis's default options the
// bound reaches only the dialing and the wait for a pooled connection, not
// a command already sent.
const attemptBound = 250 * time.Millisecond

// acquire contends for a lease. Without opts.Wait it makes one attempt. With
// it, it sleeps between attempts until a release message wakes it, or until
// the blocking lease would have expired, or, for waiters with a recorded
// place, until it is time to renew it, and never longer than lostWakeup (so
// a lost message costs at most that), nor than pollEvery while its
// subscription is not confirmed; an unreachable server is tried again,
// backing off, until ctx is done, and a refusal only an operator mends
// (see redisrefusal) ends it.
func (l *Locker) acquire(ctx context.Context, channel string, opts driver.AcquireOptions, ls *lease, w waiter) (_ driver.Lease, err error) {
	var (
		sub    *subscription
		wake   <-chan string
		queued bool
		// refused is when the latest attempt answered with a refusal was
		// sent, and refusedToken the holder's token it found (0 when it
		// found none): a grant with a greater token (see handedOver) was
		// made after the server ran that attempt, so its lease runs at
		// least until refused plus the TTL.
		refused      time.Time
		refusedToken uint64
		msg          string
		// answered says the server answered the latest attempt: the
		// cleanup is then tried on this goroutine first (see cleanUp).
		answered bool
		// failed is the failure of the attempts since the last answer, which
		// a wait that its ctx ends reports (see driver.Unreached).
		failed error
	)
	if opts.Wait {
		sub, wake, queued = l.notify.joinIfActive(channel, w.id)
		// Behind local waiters, a non-fair newcomer waits its turn for a
		// release message instead of trying at once: otherwise each
		// release would cost a failed attempt by the waiter it woke.
		queued = queued && w.id == ""
	}
	woken := false
	defer func() {
		if err != nil && !errors.Is(err, driver.ErrNotAcquired) {
			l.cleanUp(ctx, w.cleanup, answered)
		}
		if sub != nil {
			l.notify.leave(sub, w.id, (err != nil && woken) || (err == nil && w.shared))
		}
	}()
	unreachable := driver.Backoff{Max: maxUnreachablePause}
	var unknown driver.Backoff
	poll := l.pollEvery(opts.TTL)
	for {
		if queued {
			queued = false
			if _, err := l.sleep(ctx, sub, wake, lostWakeup(opts.TTL), poll, &woken); err != nil {
				return nil, err
			}
		}
		sent := time.Now()
		r, err := l.attempt(ctx, ls, w, opts.Wait)
		answered = err == nil
		if err != nil && opts.Wait && ctx.Err() != nil && !redisrefusal.Permanent(err) {
			if errors.Is(err, driver.ErrUnavailable) {
				failed = err
			}
			return nil, driver.Unreached(ctx, failed)
		}
		switch {
		case err == nil && r[0] == 1:
			ls.token = uint64(r[1])
			switch {
			case r[2] != 0:
				ls.day.Store(uint32(r[2]))
				ls.waiting = byte(r[3])
			case ls.kind == kindMutex:
				ls.day.Store(dayOf(sent, pxOf(opts.TTL)))
			}
			ls.renewed(sent, pxOf(opts.TTL))
			return ls, nil
		case err != nil && opts.Wait && errors.Is(err, driver.ErrUnavailable) && !redisrefusal.Permanent(err):
			failed = err
			if msg, err = l.sleep(ctx, sub, wake, unreachable.Next(), poll, &woken); err != nil {
				if ctx.Err() != nil {
					return nil, driver.Unreached(ctx, failed)
				}
				return nil, err
			}
			if l.handedOver(ls, msg, refused, refusedToken, opts.TTL) {
				return ls, nil
			}
			continue
		case err != nil:
			return nil, err
		case !opts.Wait:
			return nil, driver.ErrNotAcquired
		}
		unreachable.Reset()
		failed = nil
		refused, refusedToken = sent, uint64(r[2])
		if sub == nil {
			if sub, wake, err = l.notify.join(ctx, channel, w.id, poll); err != nil {
				return nil, err
			}
			// A release may have been published before the subscription
			// took effect: look again before sleeping.
			woken = false
			continue
		}
		d := time.Duration(r[1])*time.Millisecond + time.Millisecond
		switch {
		case r[1] >= 0:
			unknown.Reset()
		case w.keepAlive > 0:
			// A fair waiter ahead was let in: its release will say who
			// is next, and the place must be renewed meanwhile anyway.
			d = w.keepAlive
		default:
			// The blocking lease vanished just after the attempt, maybe
			// expired, which publishes nothing.
			d = unknown.Next()
		}
		if w.keepAlive > 0 {
			d = min(d, w.keepAlive)
		}
		if msg, err = l.sleep(ctx, sub, wake, min(d, lostWakeup(opts.TTL)), poll, &woken); err != nil {
			return nil, err
		}
		if l.handedOver(ls, msg, refused, refusedToken, opts.TTL) {
			return ls, nil
		}
	}
}

// handedOver takes the lock when msg is the grant of a release that handed
// it to the waiter (see release.lua): '<token>:<day>:<waiting flag>'. The
// lease's deadline on the server is the grant's clock plus the TTL; the
// waiter cannot tell when the grant was made (not when the message came:
// the server's clock started earlier), only that it came after the server
// answered the attempt sent at refused with a refusal, so it counts the
// lease from there: a waiter woken a moment after its last attempt loses
// that moment, one that slept long loses more, but never counts a lease
// the server does not keep.
//
// That the grant came after the refusal, the token says, not the message's
// arrival: messages come on the subscription's connection, which keeps no
// order with the attempts' connection, so a grant made before the refusal
// (the lock has since moved on: its lease ran out, or it was forced away,
// and another contender took it) can arrive after it. Tokens only grow on
// a key, and a grant's is past the token before it, so a grant made after
// the refused attempt ran has a token greater than the one that attempt
// found, and one made before it has not.
//
// Without such an attempt, or with one that found no token (another
// format's lock), or one so old (the server was out of reach since) that
// the lease would be mostly spent, or with a grant not past its token, or
// under WithWaitReplicas, which must see the grant acknowledged, it returns
// false, and the next attempt decides: it finds the lock its own, and
// extends it, only if it still is.
func (l *Locker) handedOver(ls *lease, msg string, refused time.Time, refusedToken uint64, ttl time.Duration) bool {
	if msg == "" || refused.IsZero() || refusedToken == 0 || time.Since(refused) > ttl/2 || l.cfg.replicas > 0 {
		return false
	}
	token, rest, _ := strings.Cut(msg, ":")
	day, flag, _ := strings.Cut(rest, ":")
	t, err1 := strconv.ParseUint(token, 10, 64)
	d, err2 := strconv.ParseUint(day, 10, 32)
	if err1 != nil || err2 != nil || len(flag) != 1 || flag[0] < '0' || flag[0] > '2' || t <= refusedToken {
		return false
	}
	ls.token = t
	ls.day.Store(uint32(d))
	ls.waiting = flag[0] - '0'
	ls.renewed(refused, pxOf(ttl))
	return true
}

// lostWakeup bounds every sleep that a release message would end: a
// message is lost when the subscription goes down with its node before the
// notifier knows, or when it names a waiter that is gone (after a failover,
// the records that lost writes left behind are named first), and the
// waiter it was for must come back by itself, within a fraction of the TTL
// rather than when the holder's lease would have run out.
func lostWakeup(ttl time.Duration) time.Duration { return max(ttl/4, time.Millisecond) }

// pollEvery is how often a waiter whose subscription is not confirmed (not
// yet, or no longer) comes back on its own: well within the handoff window
// of a fair waiter, so that a head that cannot be told keeps its turn.
func (l *Locker) pollEvery(ttl time.Duration) time.Duration {
	return max(min(lostWakeup(ttl), handoffWindow(l.cfg.waiterTimeout)/2), time.Millisecond)
}

// sleep waits for a wake-up or d, or, while sub is not confirmed, for poll
// at most; a change of sub's state (confirmed, or lost) ends it too. It
// returns the wake-up's message (a grant, or ""), ctx's error when ctx
// ended first, and errClosed when the Locker was closed.
func (l *Locker) sleep(ctx context.Context, sub *subscription, wake <-chan string, d, poll time.Duration, woken *bool) (msg string, err error) {
	var changed <-chan struct{}
	if sub != nil {
		var confirmed bool
		if changed, confirmed = l.notify.watch(sub); !confirmed {
			d = min(d, poll)
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-l.notify.closed:
		return "", errClosed
	case msg = <-wake:
		*woken = true
	case <-changed:
		*woken = false
	case <-timer.C:
		*woken = false
	}
	return msg, nil
}

// attempt makes one acquisition attempt. With WithWaitReplicas it runs on a
// connection of its own, because WAIT counts the replicas that acknowledged
// the writes of the connection it is sent on.
func (l *Locker) attempt(ctx context.Context, ls *lease, w waiter, queued bool) (reply, error) {
	if l.cfg.replicas == 0 {
		if !w.bounded || !queued {
			return w.attempt(ctx, l.sc, queued)
		}
		f := w.flight
		if f == nil {
			f = new(flight)
		}
		actx := l.bound.begin(ctx, f)
		defer l.bound.end(f)
		r, err := w.attempt(actx, l.sc, queued)
		if err != nil && context.Cause(actx) == errNoAnswer {
			// The client reports the cut as a cancellation, which is
			// nobody's: the caller's own error once its ctx is done too.
			if err = ctx.Err(); err == nil {
				err = fmt.Errorf("%w: redis: no answer within %v%s", driver.ErrUnavailable, attemptBound, l.unconnected())
			}
		}
		return r, err
	}
	var conn *goredis.Conn
	switch c := l.client.(type) {
	case *goredis.Client:
		conn = c.Conn()
	case *goredis.ClusterClient:
		node, err := c.MasterForKey(ctx, lockKeyOf(ls.key))
		if err != nil {
			return reply{}, driver.Unavailable(ctx, err)
		}
		conn = node.Conn()
	}
	defer conn.Close()
	r, err := w.attempt(ctx, conn, queued)
	if err != nil || r[0] != 1 {
		return r, err
	}
	acked, err := conn.Wait(ctx, l.cfg.replicas, l.cfg.replicaWait).Result()
	if err == nil && acked >= int64(l.cfg.replicas) {
		return r, nil
	}
	if err == nil {
		err = fmt.Errorf("%d of %d replicas acknowledged the lock within %v%s", acked, l.cfg.replicas, l.cfg.replicaWait, replicasOf(ctx, conn))
	}
	// The lock must not outlive the failed acquisition.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	ls.releaseOn(rctx, conn)
	return reply{}, driver.Unavailable(ctx, err)
}

// unconnected says, for an attempt that had no answer, that the client has
// no connection open, when it has none: go-redis dials on a goroutine of its
// own, trying again after a refusal (five times, 100ms apart, by default),
// so an attempt cut short at its bound hears nothing of the refusal, which
// only go-redis's log then tells; the server cannot be connected to at all,
// and the address (a single server's) is likely what to look at.
func (l *Locker) unconnected() string {
	switch c := l.client.(type) {
	case *goredis.Client:
		if c.PoolStats().TotalConns == 0 {
			// A Sentinel-managed client's Addr is a placeholder: the master
			// is whichever Sentinel names.
			to := c.Options().Addr
			if to == "FailoverClient" {
				to = "the master its Sentinels name"
			}
			return fmt.Sprintf(", with no connection open to %s (go-redis logs why its dials fail)", to)
		}
	case *goredis.ClusterClient:
		if c.PoolStats().TotalConns == 0 {
			return ", with no connection open to any node (go-redis logs why its dials fail)"
		}
	}
	return ""
}

// replicasOf says how many replicas the master behind conn has, when it
// tells: after a failover that left a shard without replicas, no WAIT can
// succeed until one rejoins, and the error should say so.
func replicasOf(ctx context.Context, conn *goredis.Conn) string {
	info, err := conn.Info(ctx, "replication").Result()
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(info, "\n") {
		if n, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			return fmt.Sprintf(" (the master has %s connected replicas; locks on it fail until enough rejoin)", n)
		}
	}
	return ""
}

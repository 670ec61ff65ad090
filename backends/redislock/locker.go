package redislock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// Locker is a warden lock backend on one Redis deployment: a single server,
// a Sentinel-managed primary or a Cluster (any goredis.UniversalClient). It
// implements driver.Locker, driver.RWLocker, driver.Semaphorer and
// driver.BatchRefresher. It is safe for concurrent use.
type Locker struct {
	client goredis.UniversalClient
	sc     *scripter // client, for scripts
	cfg    config
	s      *scripts
	notify *notifier
	// wake is the Locker's own channel: a message that names one of its
	// mutex waiters, fair or not, goes there, so only this process hears
	// it.
	wake string
	// waitArg is the waiter timeout in milliseconds as a script argument,
	// converted once.
	waitArg any
	// handedOff is the Locker's latest release that handed the lock to a
	// waiter, or reserved it for the head of the fair queue: a waiting
	// acquisition of that key, which comes right after it in a loop, will
	// find the lock held, so it reads the state before writing its own
	// (see acquire.lua), a command less, and, right after the release,
	// takes the release's clock for the server's (see rewait.lua, and
	// fair_acquire.lua for a fair one), one more.
	handedOff atomic.Pointer[handoff]
	// bound cuts short the waiting attempts that have no answer (see
	// attemptBound).
	bound watchdog
	// cleanups counts the cleanups under way on goroutines of their own
	// (see cleanUp).
	cleanups cleanups
}

type config struct {
	waiterTimeout time.Duration
	replicas      int
	replicaWait   time.Duration
}

// Option configures a Locker. An invalid value makes New fail.
type Option func(*config) error

// WithWaiterTimeout sets how long a fair waiter, or a writer waiting for
// readers, keeps its place without coming back (default 5s, at least 3ms). A
// waiting process renews its place every third of it; a crashed one loses
// its place after it, so it bounds how long a crashed waiter can hold up the
// queue. While the lock is free, a fair waiter that blocks it has less: it
// loses its place once it is late renewing it by a handoff window (250ms,
// or a fifth of the timeout when that is shorter), and at the head it has
// that window to claim the lock; see the README's "Fair mode". Waiters of
// one key may use different timeouts: each place records its own.
func WithWaiterTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 3*time.Millisecond {
			return fmt.Errorf("%w: waiter timeout %v, want at least 3ms", driver.ErrInvalidOption, d)
		}
		c.waiterTimeout = d
		return nil
	}
}

// WithWaitReplicas makes every acquisition wait, with the WAIT command, until
// n replicas have acknowledged it or timeout passes; when fewer acknowledge,
// the lock is released again and Acquire fails with driver.ErrUnavailable,
// saying how many replicas the master has. There is no degraded mode: after
// a failover that left a shard with fewer than n replicas, locks on that
// shard fail (and waiting acquisitions keep trying) until enough rejoin,
// because a lock that one crash can erase is what this option exists to
// refuse.
//
// It narrows, but does not close, the window in which a failover promotes a
// replica that never saw the lock: WAIT does not make Redis replication
// strongly consistent, and a replica that acknowledged can still lose the
// write if it restarts without persistence. It costs one more round trip per
// acquisition and needs a *goredis.Client (single node, Sentinel) or a
// *goredis.ClusterClient.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(c *config) error {
		if n < 1 || timeout <= 0 {
			return fmt.Errorf("%w: WAIT for %d replicas within %v", driver.ErrInvalidOption, n, timeout)
		}
		c.replicas, c.replicaWait = n, timeout
		return nil
	}
}

// New returns a Locker that keeps its locks on client. The caller keeps
// ownership of client and closes it after the Locker's Close. An invalid
// option is an error wrapping driver.ErrInvalidOption.
func New(client goredis.UniversalClient, opts ...Option) (*Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", driver.ErrInvalidOption)
	}
	c := config{waiterTimeout: 5 * time.Second}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.replicas > 0 {
		switch client.(type) {
		case *goredis.Client, *goredis.ClusterClient:
		default:
			return nil, fmt.Errorf("%w: WithWaitReplicas with a %T", driver.ErrUnsupported, client)
		}
	}
	sc := newScripter(client)
	return &Locker{client: client, sc: sc, cfg: c, s: newScripts(), notify: newNotifier(client, sc.reload),
		wake: wakePrefix + rand.Text(), waitArg: c.waiterTimeout.Milliseconds()}, nil
}

// BoundedByDeadline implements driver.DeadlineBounded. It is true on a
// *goredis.Client (a single server, or Sentinel's failover client) made
// with ContextTimeoutEnabled and read and write timeouts that set a
// deadline (not -2): such a client sets its connection's deadline from the
// context, gives up waiting for a pooled connection or dialling one at it,
// and does not retry past it, so every call of the Locker returns once its
// ctx's deadline has passed, and guard spares it the hand-off to another
// goroutine where nothing else can end the call (a release, bounded by
// guard's release timeout). go-redis does not end a command already sent
// when its context is cancelled before its deadline, so acquisitions made
// with a context that can be cancelled stay watched. It is false:
//   - with go-redis's default options: reads then wait out ReadTimeout
//     whatever the context says, and a timed-out read is sent again;
//   - with a read or write timeout of -2, which sets no deadline at all;
//   - on a *goredis.ClusterClient, which routes each command by the
//     command table it fetches from the servers under a 5 s context of its
//     own, whatever the caller's deadline, until one fetch succeeds;
//   - with WithWaitReplicas: an acquisition whose WAIT fails gives its
//     lock back before it tries again, on the caller's goroutine, for up to
//     two seconds past ctx's end.
//
// A hook, Dialer or OnConnect of the client's own that blocks is the
// client's: the bound then holds only as far as they heed the context.
func (l *Locker) BoundedByDeadline() bool {
	return l.cfg.replicas == 0 && honoursDeadlines(l.client)
}

// honoursDeadlines reports whether client is a go-redis Client whose
// every call ends by its context's deadline (see Locker.BoundedByDeadline).
// The options read are those the client settled at its making, where a
// timeout of -2 became -1.
func honoursDeadlines(client goredis.UniversalClient) bool {
	c, ok := client.(*goredis.Client)
	if !ok {
		return false
	}
	o := c.Options()
	return o.ContextTimeoutEnabled && o.ReadTimeout >= 0 && o.WriteTimeout >= 0
}

// Close ends the Pub/Sub connection the Locker's waiters share. Waits in
// progress end with an error, and so does any later waiting acquisition;
// held leases, and acquisitions that do not wait, go on working on the
// client, which stays the caller's to close. The cleanups of unanswered
// acquisitions that were to run again over the next seconds (see cleanUp)
// run once more at once instead, and Close returns once they, and the
// cleanups making their first run, are done, within 2s on a server that
// does not answer them.
func (l *Locker) Close() error {
	err := l.notify.close()
	l.cleanups.close(cleanupTimeout)
	return err
}

var (
	_ driver.Locker          = (*Locker)(nil)
	_ driver.RWLocker        = (*Locker)(nil)
	_ driver.Semaphorer      = (*Locker)(nil)
	_ driver.BatchRefresher  = (*Locker)(nil)
	_ driver.Inspector       = (*Locker)(nil)
	_ driver.Lister          = (*Locker)(nil)
	_ driver.ForceReleaser   = (*Locker)(nil)
	_ driver.DeadlineBounded = (*Locker)(nil)
)

// Acquire implements driver.Locker. With opts.Fair the lock goes to waiters
// in the order they arrived.
func (l *Locker) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	owner := ownerID(opts.Owner)
	px := pxOf(opts.TTL)
	ls := &lease{l: l, key: key, owner: owner, kind: kindMutex, fair: opts.Fair}
	var w waiter
	if opts.Fair {
		n := mutexNamesOf(key)
		channel := n.channel
		keys := []string{n.lock, n.queue, n.deadlines}
		waitMs := l.cfg.waiterTimeout.Milliseconds()
		handoffMs := handoffWindow(l.cfg.waiterTimeout).Milliseconds()
		// The place carries the waiter timeout, from which any contender
		// tells when its waiter is late renewing it (fair_acquire.lua),
		// and the Locker's channel, where the messages naming it go.
		place := strconv.FormatInt(waitMs, 10) + ":" + l.wake + "\n" + owner
		// placed says the last attempt queued the contender: a place gone
		// since is a sign of lost writes.
		placed := false
		// clock, when not 0, is the server's clock at this Locker's
		// release of the key a moment ago, which reserved it for the head
		// of the queue: the first attempt, most likely refused, sends it
		// for TIME (see fair_acquire.lua). The place that attempt writes
		// is due early by the clock's age, which shrinks the handoff
		// window by which a head late renewing it is told from one that
		// is gone: so the clock is sent only while its age is a small
		// part of that window, not of the waiter timeout, as rewait.lua's
		// is, which can be longer than the window.
		var clock int64
		if h := l.handedOff.Load(); h != nil && h.key == key && opts.Wait && l.handedOff.CompareAndSwap(h, nil) && time.Since(h.at) < handoffWindow(l.cfg.waiterTimeout)/8 {
			clock = h.clock
		}
		w = waiter{
			id:        place,
			keepAlive: l.cfg.waiterTimeout / 3,
			bounded:   true,
			contender: &funcs{try: func(ctx context.Context, sc goredis.Scripter, queued bool) (reply, error) {
				mode := flag(queued)
				if queued && placed {
					mode = "2"
				}
				// An attempt whose answer never came may have taken
				// the lock: the next one finds it the contender's, as
				// it finds one that a release reserved for it.
				args := []any{owner, px, mode, waitMs, handoffMs, channel, place}
				if clock != 0 {
					args, clock = append(args, clock), 0
				}
				r, err := run(ctx, sc, l.s.fairAcquire, keys, args...)
				if err == nil {
					placed = queued && r[0] == 0
				}
				return r, err
			}, clean: func(ctx context.Context) error {
				// The place first: while it is there, the waiter is
				// named by releases, and the lock waits for it a
				// handoff window.
				return errors.Join(
					l.s.dequeue.Run(ctx, l.sc, []string{n.queue, n.deadlines, n.lock}, place, channel).Err(),
					l.s.release.Run(ctx, l.sc, n.releaseKeys(), owner, "0", "0", channel, "0").Err())
			}},
		}
	} else {
		c := &plainContender{l: l, key: key, keepAlive: l.cfg.waiterTimeout / 3, px: px}
		c.lock, c.waiters = lockWaitersOf(key)
		c.waitRecord, c.record = recordOf(l.cfg.waiterTimeout.Milliseconds(), l.wake, px, owner)
		c.cmd = [10]any{"evalsha", l.s.acquireSha, 2, &c.lock, &c.waiters, &ls.owner, &c.px, "0", &c.waitRecord, "0"}
		if h := l.handedOff.Load(); h != nil && h.key == key && opts.Wait && l.handedOff.CompareAndSwap(h, nil) {
			c.likelyHeld = true
			// The record rewait.lua writes lapses early by the time
			// since the release (see there): a small part of the
			// waiter timeout, well within what a record has left
			// when its waiter renews it.
			if time.Since(h.at) < l.cfg.waiterTimeout/16 {
				c.clock = h.clock
			}
		}
		w = waiter{id: c.record, keepAlive: c.keepAlive, bounded: true, flight: &c.flight, contender: c}
	}
	// Either waiter is named in the messages for it, which go to the
	// Locker's channel; the lock's channel is where records of an earlier
	// version are told.
	return l.acquire(ctx, l.wake, opts, ls, w)
}

// plainContender makes the attempts of an acquisition of a plain lock. A
// waiting one is recorded among the lock's waiters, so that a release
// hands the lock to one of them, with no attempt at all, instead of
// leaving it to whichever process comes first. The record says where the
// message goes, the Locker's own channel, which only this process listens
// to (on the lock's channel, every process with a waiter would receive
// every release's message), and the TTL the release grants.
//
// What the attempts send and learn lives in this one struct, made once
// per acquisition: closures over it would cost an allocation each, and one
// more for each variable they change, on the path of every acquisition.
type plainContender struct {
	l   *Locker
	key string
	// lock and waiters are the two keys its attempts name, cut from one
	// string (lockWaitersOf): the other names of the lock (mutexNamesOf)
	// only its cleanup needs, which makes them.
	lock, waiters string
	// cmd is the command of every attempt (see scripter.evalsha),
	// converted once: only the mode (cmd[7]) and the unanswered flag
	// (cmd[9]) change, and those are constants, which cost no allocation
	// as values of an interface. The strings and numbers go in as
	// pointers to the fields that hold them (go-redis writes a *string or
	// an *int64 as the value), since a string or an int64 made an
	// interface value is copied to the heap, an allocation each. The
	// arguments start at cmd[5], the owner.
	cmd [10]any
	// px and waitRecord (the waiter timeout and record, see recordOf) are
	// what cmd[6] and cmd[8] point to; record is the end of waitRecord.
	px                 int64
	waitRecord, record string
	keepAlive          time.Duration
	// renewed is when the record was last renewed: an attempt within half
	// a keep-alive of it leaves it as it is, a command less on every
	// attempt a release's wake-up brings. The sleeps between attempts are
	// bounded by the keep-alive, so a record is renewed within one and a
	// half of them, half the waiter timeout.
	renewed time.Time
	// recorded says an attempt recorded the contender; unanswered that one
	// got no answer, so may have taken the lock unbeknownst (acquire.lua
	// then looks for it).
	recorded, unanswered bool
	// likelyHeld: this Locker's latest release of the key handed it to a
	// waiter (see Locker.handedOff), so the first attempt reads first;
	// clock, when not 0, is the server's clock at that release, which the
	// first attempt sends to rewait.lua in alt, instead.
	likelyHeld bool
	clock      int64
	// score is clock plus the waiter timeout, what rewait.lua records the
	// contender with.
	score int64
	// flight is its attempts' room on the Locker's watchdog (see
	// waiter.flight), in the one allocation of the struct.
	flight flight
	// alt is the command of an attempt that does not send cmd: the first
	// one's, to rewait.lua (mode '4'), or a shorter one (mode '0', see
	// args). The attempt fills it before sending, and nothing reads it
	// once the attempt is answered.
	alt [10]any
}

func (c *plainContender) attempt(ctx context.Context, sc goredis.Scripter, queued bool) (reply, error) {
	sent := time.Now()
	var mode any = "0"
	switch {
	case c.recorded && sent.Sub(c.renewed) < c.keepAlive/2:
		mode = "3"
	case c.recorded:
		mode = "2"
	case queued && c.likelyHeld:
		mode, c.likelyHeld = "4", false
	case queued:
		mode = "1"
	}
	c.cmd[7], c.cmd[9] = mode, flagArg(c.unanswered)
	var r reply
	var err error
	if mode == "4" && c.clock != 0 && sc == goredis.Scripter(c.l.sc) {
		s := c.l.s
		// Mode 4 comes once per acquisition: clock is not read again.
		c.score = c.clock + c.l.cfg.waiterTimeout.Milliseconds()
		c.alt = [10]any{"evalsha", s.rewaitSha, 2, &c.lock, &c.waiters, c.cmd[5], &c.record, &c.clock, &c.score, c.l.waitArg}
		r, err = answer(ctx, c.l.sc.evalsha(ctx, s.rewaitSrc, c.alt[:]))
		if err == nil && r[0] == 0 {
			r[1] -= c.clock // the deadline, made the pttl
		} else if err == nil && r[0] == -1 {
			// Not held by another as the release left it: a full
			// attempt decides.
			r, err = answer(ctx, c.l.sc.evalsha(ctx, s.acquireSrc, c.args(mode)))
		}
	} else if sc == goredis.Scripter(c.l.sc) {
		r, err = answer(ctx, c.l.sc.evalsha(ctx, c.l.s.acquireSrc, c.args(mode)))
	} else {
		// A connection of its own (WithWaitReplicas): rare enough for
		// Script.Run's conversions.
		r, err = run(ctx, sc, c.l.s.acquire, []string{c.lock, c.waiters}, c.cmd[5:]...)
	}
	if err == nil && r[0] == 0 && queued {
		c.recorded = true
		if mode != "3" {
			c.renewed = sent
		}
	}
	c.unanswered = c.unanswered || err != nil
	return r, err
}

// args is cmd as an attempt in mode sends it. Each key or argument costs
// the server work to read and hand to the script (about 500 instructions
// for the one-character flag, 1-1.5k for a key, counted by callgrind), so
// what acquire.lua reads only in some modes is left out: the unanswered
// flag when it is '0', and for a contender that does not wait (mode '0'),
// its waiter timeout and record, and then the mode and the waiters' key
// too, which acquire.lua reads only to take a record out.
func (c *plainContender) args(mode any) []any {
	switch {
	case c.unanswered:
		return c.cmd[:]
	case mode == "0":
		c.alt = [10]any{"evalsha", c.l.s.acquireSha, 1, &c.lock, c.cmd[5], &c.px}
		return c.alt[:6]
	}
	return c.cmd[:9]
}

// cleanup takes the record out before releasing: a release may hand the
// lock to the record until it is gone, and the release that follows frees
// what one handed over before.
func (c *plainContender) cleanup(ctx context.Context) error {
	s, n := c.l.s, mutexNamesOf(c.key)
	keys := n.releaseKeys()
	if c.recorded || c.unanswered {
		if err := s.unwaitMutex.Run(ctx, c.l.sc, keys, c.record, n.channel).Err(); err != nil {
			return err
		}
	}
	return s.release.Run(ctx, c.l.sc, keys, c.cmd[5], "0", "0", n.channel, "0").Err()
}

// recordOf is a plain waiter's record: its Locker's channel, its TTL and
// its owner, one per line (see acquire.lua), and arg, the waiter timeout
// wait and a newline before it, which acquire.lua takes as one argument;
// record is the end of arg, one allocation for both.
func recordOf(wait int64, wake string, px int64, owner string) (arg, record string) {
	var num [20]byte
	var b strings.Builder
	b.Grow(len(wake) + len(owner) + 2*len(num) + 3)
	b.Write(strconv.AppendInt(num[:0], wait, 10))
	b.WriteByte('\n')
	i := b.Len()
	b.WriteString(wake)
	b.WriteByte('\n')
	b.Write(strconv.AppendInt(num[:0], px, 10))
	b.WriteByte('\n')
	b.WriteString(owner)
	arg = b.String()
	return arg, arg[i:]
}

// maxHandoff is how long the head of a fair queue has to claim a free lock
// before the waiters behind it may drop it. A live head is woken by the
// release, or by its own timer when the lease expires, and claims within a
// round trip; the rest is room for a loaded machine, or a wake-up lost with
// a Pub/Sub connection (a head that misses the window only goes to the back
// of the queue).
const maxHandoff = 250 * time.Millisecond

// handoffWindow is maxHandoff, or less under a short waiter timeout: a
// window must leave a waiter that renews its place every third of the
// timeout room to be told apart from one told to confirm it.
func handoffWindow(waiterTimeout time.Duration) time.Duration {
	return max(min(maxHandoff, waiterTimeout/5), time.Millisecond)
}

// reply is the answer of an acquisition script: {1, token} or {1, token,
// day, waiting flag} for a grant, {0, ms} or, from a plain lock's attempt,
// {0, ms, the holder's token} otherwise, the rest 0 (a day is never 0, nor
// a token). It is an array, not a slice, so that it costs no allocation.
type reply [4]int64

// run runs a script that answers an array of integers (see reply); a plain
// lock's grant that found nobody waiting answers its token alone, taken as
// {1, token}.
func run(ctx context.Context, sc goredis.Scripter, s *goredis.Script, keys []string, args ...any) (reply, error) {
	return answer(ctx, s.Run(ctx, sc, keys, args...))
}

// answer reads the reply of an acquisition script (see run). A plain
// lock's grant answers its token as a string of digits, which spares the
// server formatting a number (see acquire.lua).
func answer(ctx context.Context, cmd *goredis.Cmd) (reply, error) {
	var r reply
	v, err := cmd.Result()
	if err != nil {
		return r, driver.Unavailable(ctx, err)
	}
	switch v := v.(type) {
	case int64, string:
		r[0] = 1
		r[1], err = integer(v)
		return r, err
	case []any:
		if len(v) < 2 || len(v) > 4 {
			return r, fmt.Errorf("%w: a script answered %d values, want 2 to 4", driver.ErrUnavailable, len(v))
		}
		for i, x := range v {
			if r[i], err = integer(x); err != nil {
				return r, err
			}
		}
		return r, nil
	}
	return r, fmt.Errorf("%w: a script answered %T, want integers", driver.ErrUnavailable, v)
}

// integer reads one value of a script's answer: an integer, or the digits
// of one.
func integer(v any) (int64, error) {
	switch v := v.(type) {
	case int64:
		return v, nil
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: a script answered %q, want an integer", driver.ErrUnavailable, v)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: a script answered %T in an array of integers", driver.ErrUnavailable, v)
}

// pxOf is the PX a TTL is sent as: whole milliseconds, rounded up, so that
// the server never keeps a lease for less than was asked. It rounds by the
// remainder: ttl plus a millisecond overflows for a TTL of math.MaxInt64.
func pxOf(ttl time.Duration) int64 {
	px := int64(ttl / time.Millisecond)
	if ttl%time.Millisecond != 0 {
		px++
	}
	return px
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// flagArg is flag as a script argument.
func flagArg(b bool) any {
	if b {
		return "1"
	}
	return "0"
}

// wakePrefix starts the name of a Locker's own channel (Locker.wake).
const wakePrefix = "warden:wake:"

// errClosed ends the waits of a closed Locker. It does not wrap
// driver.ErrUnavailable, which a waiting Acquire would retry forever.
var errClosed = errors.New("the Locker is closed")

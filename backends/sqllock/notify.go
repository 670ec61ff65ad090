package sqllock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"errors"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

const (
	// listenIdle is how long the listener outlives its last waiter, so
	// that a stream of short waits does not open a connection each.
	listenIdle = 5 * time.Second
	// relistenMax bounds the pause between two attempts to re-establish a
	// failed listener. Waiters poll meanwhile, so this only bounds how long
	// handoffs are slow after the database comes back.
	relistenMax = 5 * time.Second
	// maxChannel is PostgreSQL's identifier limit (NAMEDATALEN - 1): LISTEN
	// silently truncates a longer channel while pg_notify refuses it, so the
	// two would never meet.
	maxChannel = 63
)

// ErrCannotListen is what a Listener returns when the pool's connections
// cannot wait for notifications (another driver than the one it is for): the
// Locker stops listening for good and its waiters poll.
var ErrCannotListen = errors.New("warden/sqllock: the connection cannot LISTEN")

// Listener waits for PostgreSQL notifications, which database/sql has no
// portable way to do; pglisten.Listener does it through pgx, the driver of
// gorm.io/driver/postgres. It lives in its own package so that programs on
// other databases do not link pgx. Pass one with WithListener.
type Listener interface {
	// Listen runs LISTEN on channel on conn, a connection taken out of the
	// pool for it alone (discarded afterwards, never reused), calls
	// listening once the LISTEN took effect, then note with the payload of
	// every notification on channel, until conn fails or ctx ends. It
	// returns an error wrapping ErrCannotListen when conn's driver is not
	// its own.
	Listen(ctx context.Context, conn *sql.Conn, channel string, listening func(), note func(payload string)) error
}

// channelName is the NOTIFY channel of a lock table. Lockers on one table
// must agree on it, so it is derived from the table name alone.
func channelName(table string) string {
	if len(table) <= maxChannel {
		return table
	}
	sum := sha256.Sum256([]byte(table))
	return "warden_" + hex.EncodeToString(sum[:16])
}

// notifier is a Locker's PostgreSQL listener: one connection LISTENing on
// the lock table's channel while any of the Locker's Acquire calls waits,
// and the local waiters it wakes. It is an accelerator only: a waiter keeps
// its backoff timer, so a missed notification or a dead listener costs at
// most one backoff pause.
type notifier struct {
	pool     *sql.DB
	channel  string
	listener Listener

	mu      sync.Mutex
	subs    map[string][]*waiter // per lock name, in arrival order
	count   int                  // waiters in subs
	cancel  context.CancelFunc   // stops the running listener; nil when none runs
	idle    *time.Timer          // stops the listener once no waiter is left
	closed  bool
	useless bool // the connections cannot LISTEN: never start again
	wg      sync.WaitGroup

	// Counters for tests: LISTENs established, listener connections lost,
	// and waiters woken by a notification (not by a reconnect).
	listens, drops, woken atomic.Uint64
}

// waiter is one waiting Acquire's registration with the notifier.
type waiter struct {
	n    *notifier
	name string
	// c holds at most one pending wake-up. A wake-up that arrives while
	// its waiter is busy with an attempt is kept, not lost, so the waiter
	// tries again at once after a failed attempt.
	c chan struct{}
}

func newNotifier(pool *sql.DB, table string, l Listener) *notifier {
	return &notifier{
		pool:     pool,
		channel:  channelName(table),
		listener: l,
		subs:     make(map[string][]*waiter),
	}
}

// join registers a waiter for name and makes sure the listener runs. It
// returns nil when notifications cannot be had; the caller then only polls.
func (n *notifier) join(name string) *waiter {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.useless {
		return nil
	}
	if n.pool != nil && n.pool.Stats().MaxOpenConnections == 1 {
		// The listener would hold the pool's only connection, and the
		// waiter and the holder could then never run a statement.
		return nil
	}
	w := &waiter{n: n, name: name, c: make(chan struct{}, 1)}
	n.subs[name] = append(n.subs[name], w)
	n.count++
	if n.idle != nil {
		n.idle.Stop()
		n.idle = nil
	}
	if n.cancel == nil && n.pool != nil {
		ctx, cancel := context.WithCancel(context.Background())
		n.cancel = cancel
		n.wg.Add(1)
		go n.run(ctx)
	}
	return w
}

// hot reports whether the listener runs, as it does while this Locker has
// waiters and for listenIdle after; false on a nil notifier.
func (n *notifier) hot() bool {
	if n == nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cancel != nil
}

// wake is the channel a wake-up for w arrives on; nil (never ready) for a
// nil waiter.
func (w *waiter) wake() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.c
}

// leave unregisters w. A waiter giving up (not acquiring) with a wake-up
// still pending hands it to another waiter of the name, which would
// otherwise sleep through the release that wake-up announced.
func (w *waiter) leave(passOn bool) {
	if w == nil {
		return
	}
	n := w.n
	n.mu.Lock()
	defer n.mu.Unlock()
	ws := n.subs[w.name]
	i := slices.Index(ws, w)
	if i < 0 {
		return
	}
	ws = slices.Delete(ws, i, i+1)
	n.count--
	if len(ws) == 0 {
		delete(n.subs, w.name)
	} else {
		n.subs[w.name] = ws
	}
	if passOn {
		select {
		case <-w.c:
			n.wakeOneLocked(w.name)
		default:
		}
	}
	if n.count == 0 && n.cancel != nil && n.idle == nil {
		n.idle = time.AfterFunc(listenIdle, n.stopIfIdle)
	}
}

func (n *notifier) stopIfIdle() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.count == 0 && n.cancel != nil {
		n.cancel()
		n.cancel = nil
	}
	n.idle = nil
}

// close stops the listener and waits for it to end; later waits only poll.
func (n *notifier) close() {
	if n == nil {
		return
	}
	n.mu.Lock()
	n.closed = true
	if n.cancel != nil {
		n.cancel()
		n.cancel = nil
	}
	if n.idle != nil {
		n.idle.Stop()
		n.idle = nil
	}
	n.mu.Unlock()
	n.wg.Wait()
}

// dispatch wakes one local waiter of name. Every local waiter would race
// for the one lock just released and all but one would lose; the others
// keep their backoff timers and are woken by the next release.
func (n *notifier) dispatch(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.wakeOneLocked(name) {
		n.woken.Add(1)
	}
}

// wakeOneLocked wakes the longest-registered waiter of name that has no
// wake-up pending; one that has will retry anyway.
func (n *notifier) wakeOneLocked(name string) bool {
	for _, w := range n.subs[name] {
		select {
		case w.c <- struct{}{}:
			return true
		default:
		}
	}
	return false
}

// wakeAll wakes every waiter once. It runs when a LISTEN takes effect:
// releases committed before then were not heard, and only a fresh attempt
// finds out whether one happened.
func (n *notifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ws := range n.subs {
		for _, w := range ws {
			select {
			case w.c <- struct{}{}:
			default:
			}
		}
	}
}

// run keeps a LISTEN connection up until ctx ends, re-establishing it with
// backoff when it fails.
func (n *notifier) run(ctx context.Context) {
	defer n.wg.Done()
	var delay time.Duration
	for {
		err := n.listenOnce(ctx, func() { delay = 0 })
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrCannotListen) {
			n.mu.Lock()
			n.useless = true
			// cancel is only called under mu, so a live ctx means
			// n.cancel is still this run's.
			if ctx.Err() == nil {
				n.cancel()
				n.cancel = nil
			}
			n.mu.Unlock()
			return
		}
		n.drops.Add(1)
		delay = min(max(2*delay, 50*time.Millisecond), relistenMax)
		if driver.Sleep(ctx, delay/2+mrand.N(delay/2+1), nil) != nil {
			return
		}
	}
}

// listenOnce takes a connection out of the pool and has the Listener
// dispatch notifications on it until the connection fails or ctx ends. The
// connection is then discarded, not returned: it may be broken, and a
// healthy one would still carry the LISTEN into another user's session.
func (n *notifier) listenOnce(ctx context.Context, listening func()) error {
	conn, err := n.pool.Conn(ctx)
	if err != nil {
		return err
	}
	defer discard(conn)
	return n.listener.Listen(ctx, conn, n.channel, func() {
		listening()
		n.wakeAll()
		n.listens.Add(1)
	}, n.dispatch)
}

// discard closes conn and keeps the pool from reusing it, which ends the
// database session and the LISTEN with it.
func discard(conn *sql.Conn) {
	conn.Raw(func(any) error { return sqldriver.ErrBadConn })
	conn.Close()
}

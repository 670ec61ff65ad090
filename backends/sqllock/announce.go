package sqllock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// announceDelay is how long a release by a Locker that had waiters
	// lately goes unannounced: long enough for a holder that asks again at
	// once to have taken the lock back, short beside any wait worth a
	// notification.
	announceDelay = time.Millisecond
	// announceTimeout bounds the statement that announces a release.
	announceTimeout = 5 * time.Second
)

// announcer holds the releases a Locker announces after announceDelay,
// unless an attempt of its own finds the lock taken again first. A holder
// that asks again at once, as a worker looping over a hot key does, then
// keeps the lock without waking every listening process in vain: each would
// run an attempt bound to fail, and each notification also wakes every
// listening session of the database. While an attempt of this Locker on the
// name is under way when the delay ends, the announcement waits for it (up
// to maxPostpone delays): on a loaded database an attempt can take longer
// than the delay, and its answer is what decides.
//
// One timer, made once and re-armed, serves every pending announcement: a
// holder looping over a hot key with waiters defers and drops one per cycle,
// and a timer made for each cost that cycle two allocations and twice the
// announcer's time.
type announcer struct {
	delay    time.Duration     // announceDelay but in tests
	send     func(name string) // announces name's release
	mu       sync.Mutex
	pending  map[string]announcement // by lock name
	attempts map[string]int          // attempts under way, by lock name
	t        *time.Timer             // runs fire; nil until first needed
	armed    bool                    // t is set, and its run has not yet taken mu
	wg       sync.WaitGroup          // t's runs armed or under way
	// gen numbers the deferred releases, so that an attempt only drops
	// the announcement of a release that committed before it started.
	gen atomic.Uint64
}

// maxPostpone bounds how many times an announcement waits another
// announceDelay for an attempt under way.
const maxPostpone = 20

// announcement is one deferred release announcement.
type announcement struct {
	due       time.Time
	gen       uint64
	postponed int
}

// after announces name's release after a.delay, unless the Locker finds
// name taken again before (end).
func (a *announcer) after(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending == nil {
		a.pending = make(map[string]announcement)
	}
	a.pending[name] = announcement{due: time.Now().Add(a.delay), gen: a.gen.Add(1)}
	// Every announcement waits the same delay, so an armed timer is due
	// no later than this one.
	a.armLocked(a.delay)
}

// armLocked sets the timer to run fire after d, unless it is set already.
func (a *announcer) armLocked(d time.Duration) {
	if a.armed {
		return
	}
	a.armed = true
	a.wg.Add(1)
	if a.t == nil {
		a.t = time.AfterFunc(d, a.fire)
		return
	}
	a.t.Reset(d)
}

// fire announces the releases whose delay has passed, except those with an
// attempt under way, which wait another delay, and sets the timer again for
// those left.
func (a *announcer) fire() {
	defer a.wg.Done()
	a.mu.Lock()
	a.armed = false
	now := time.Now()
	var (
		due  []string
		next time.Duration
	)
	for name, p := range a.pending {
		switch {
		case p.due.After(now):
		case a.attempts[name] > 0 && p.postponed < maxPostpone:
			p.due = now.Add(a.delay)
			p.postponed++
			a.pending[name] = p
		default:
			delete(a.pending, name)
			due = append(due, name)
			continue
		}
		if d := p.due.Sub(now); next == 0 || d < next {
			next = d
		}
	}
	if next > 0 {
		a.armLocked(next)
	}
	a.mu.Unlock()
	for _, name := range due {
		a.send(name)
	}
}

// begin is to be called before an attempt on name, and its result passed
// to end after it.
func (a *announcer) begin(name string) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.attempts == nil {
		a.attempts = make(map[string]int)
	}
	a.attempts[name]++
	return a.gen.Load()
}

// end records that the attempt on name that began at mark ended. When it
// got an answer (found), it drops the announcement of name's release, if
// one is pending and the release committed before the attempt started:
// that attempt found the lock taken again, by this Locker or another, and
// that holder's release will be announced.
func (a *announcer) end(name string, mark uint64, found bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.attempts[name]--; a.attempts[name] <= 0 {
		delete(a.attempts, name)
	}
	if p, ok := a.pending[name]; ok && found && p.gen <= mark {
		delete(a.pending, name)
		a.disarmIfIdleLocked()
	}
}

// disarmIfIdleLocked stops the timer when no announcement is left for it.
// One that has started running finds none and is not set again.
func (a *announcer) disarmIfIdleLocked() {
	if len(a.pending) == 0 && a.armed && a.t.Stop() {
		a.armed = false
		a.wg.Done()
	}
}

// flush announces every pending release now, and waits for the
// announcements under way.
func (a *announcer) flush() {
	a.mu.Lock()
	var names []string
	for name := range a.pending {
		names = append(names, name)
	}
	clear(a.pending)
	a.disarmIfIdleLocked()
	a.mu.Unlock()
	for _, name := range names {
		a.send(name)
	}
	a.wg.Wait()
}

// announce notifies l's channel of name's release. A failure is not
// reported: waiters find the lock free at their next poll anyway.
func (l *Locker) announce(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), announceTimeout)
	defer cancel()
	l.db.WithContext(ctx).Exec("SELECT pg_notify(?, ?)", l.channel, name)
}

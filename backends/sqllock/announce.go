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
type announcer struct {
	mu       sync.Mutex
	pending  map[string]announcement // by lock name
	attempts map[string]int          // attempts under way, by lock name
	wg       sync.WaitGroup          // announcements under way
	// gen numbers the deferred releases, so that an attempt only drops
	// the announcement of a release that committed before it started.
	gen atomic.Uint64
}

// maxPostpone bounds how many times an announcement waits another
// announceDelay for an attempt under way.
const maxPostpone = 20

// announcement is one deferred release announcement.
type announcement struct {
	t   *time.Timer
	gen uint64
}

// after announces name's release on l's channel after l.announceDelay,
// unless l finds name taken again before (end).
func (a *announcer) after(l *Locker, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending == nil {
		a.pending = make(map[string]announcement)
	}
	a.dropLocked(name)
	a.armLocked(l, name, a.gen.Add(1), 0)
}

func (a *announcer) armLocked(l *Locker, name string, gen uint64, postponed int) {
	a.wg.Add(1)
	t := time.AfterFunc(l.announceDelay, func() {
		defer a.wg.Done()
		a.mu.Lock()
		p, ok := a.pending[name]
		mine := ok && p.gen == gen
		if mine && a.attempts[name] > 0 && postponed < maxPostpone {
			a.armLocked(l, name, gen, postponed+1)
			a.mu.Unlock()
			return
		}
		if mine {
			delete(a.pending, name)
		}
		a.mu.Unlock()
		if mine {
			l.announce(name)
		}
	})
	a.pending[name] = announcement{t, gen}
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
		a.dropLocked(name)
	}
}

func (a *announcer) dropLocked(name string) {
	if p, ok := a.pending[name]; ok {
		delete(a.pending, name)
		if p.t.Stop() {
			a.wg.Done()
		}
	}
}

// flush announces every pending release now, and waits for the
// announcements under way.
func (a *announcer) flush(l *Locker) {
	a.mu.Lock()
	var names []string
	for name := range a.pending {
		names = append(names, name)
		a.dropLocked(name)
	}
	a.mu.Unlock()
	for _, name := range names {
		l.announce(name)
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

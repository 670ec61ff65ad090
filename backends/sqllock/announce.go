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
// listening session of the database.
type announcer struct {
	mu      sync.Mutex
	pending map[string]announcement // by lock name
	wg      sync.WaitGroup          // announcements under way
	// gen numbers the deferred releases, so that an attempt only drops
	// the announcement of a release that committed before it started.
	gen atomic.Uint64
}

// announcement is one deferred release announcement.
type announcement struct {
	t   *time.Timer
	gen uint64
}

// after announces name's release on l's channel after l.announceDelay,
// unless l finds name taken again before (taken).
func (a *announcer) after(l *Locker, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending == nil {
		a.pending = make(map[string]announcement)
	}
	a.dropLocked(name)
	gen := a.gen.Add(1)
	a.wg.Add(1)
	t := time.AfterFunc(l.announceDelay, func() {
		defer a.wg.Done()
		a.mu.Lock()
		mine := a.pending[name].gen == gen
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

// mark is to be read before an attempt and passed to taken after it.
func (a *announcer) mark() uint64 { return a.gen.Load() }

// taken drops the announcement of name's release, if one is pending and
// the release committed before the attempt that started at mark: that
// attempt found the lock taken again, by this Locker or another, and that
// holder's release will be announced.
func (a *announcer) taken(name string, mark uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p, ok := a.pending[name]; ok && p.gen <= mark {
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

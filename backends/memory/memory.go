// Package memory is an in-process lock backend: a real one, for programs
// that run as a single process and for tests, not a stand-in for the
// distributed backends.
//
// Leases expire after their TTL on the monotonic clock, every grant carries a
// fencing token from one counter per Locker (so tokens increase per key),
// waiters queue first-come, first-served and are woken one at a time, and
// read/write locks and counting semaphores are offered. Exclusive locks,
// read/write locks and semaphores on the same key are separate locks.
//
// To test code that takes locks, give it a Guard on a Locker from New; a
// second Guard on the same Locker plays another replica. Inside a
// testing/synctest bubble, with the Guard made there too, leases run out
// and renewals fall due on the bubble's clock, so a lost lock (an expired
// lease, Guard.ForceRelease) is tested without waiting.
package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// Locker is the in-process backend. The zero value is not usable; call New.
type Locker struct {
	mu      sync.Mutex
	entries map[entryKey]*entry
	free    []*entry // entries let go of, kept for reuse, so a new key costs no allocation
	token   uint64
	// idleRing lists the latest entries to fall idle, which stay in entries
	// until maxIdle later ones push them out: a key taken and released in
	// a loop costs no map deletion and insertion per cycle.
	idleRing [maxIdle]idleEntry
	idleAt   int    // next slot of idle to fill, oldest first
	idleSeq  uint64 // numbers each fall into idleness
}

// maxIdle bounds the idle entries kept in the map.
const maxIdle = 64

// idleEntry is one fall of e into idleness; stale once e is used again.
type idleEntry struct {
	e   *entry
	seq uint64
}

// New returns an empty Locker.
func New() *Locker {
	return &Locker{entries: map[entryKey]*entry{}}
}

type kind uint8

const (
	exclusive kind = iota
	rwRead
	rwWrite
	sem
)

// entryKey separates the three kinds of lock that may share a key name.
type entryKey struct {
	rw  uint8 // 0 exclusive, 1 read/write, 2 semaphore
	key string
}

func (k kind) space() uint8 {
	switch k {
	case rwRead, rwWrite:
		return 1
	case sem:
		return 2
	}
	return 0
}

type holder struct {
	token   uint64
	shared  bool
	expires time.Time
	owner   string
}

type waiter struct {
	kind    kind
	permits int
	ttl     time.Duration
	owner   string
	ready   chan struct{} // closed when granted
	token   uint64        // set when granted
	expires time.Time     // set when granted
}

type entry struct {
	key     entryKey
	holders []holder
	queue   []*waiter
	timer   *time.Timer // wakes the queue when the earliest holder expires
	timerAt time.Time   // when timer fires; zero when it is not set
	gen     uint64      // bumped on idleness, so a stale timer does nothing
	idleSeq uint64      // the idle slot naming it; 0 when it is in use
	live    bool        // in the Locker's entries, under its key
}

// Acquire implements driver.Locker.
func (l *Locker) Acquire(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, exclusive, 1, o)
}

// AcquireRead implements driver.RWLocker.
func (l *Locker) AcquireRead(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, rwRead, 0, o)
}

// AcquireWrite implements driver.RWLocker.
func (l *Locker) AcquireWrite(ctx context.Context, key string, o driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, rwWrite, 1, o)
}

// AcquireSemaphore implements driver.Semaphorer.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, permits int, o driver.AcquireOptions) (driver.Lease, error) {
	if permits < 1 {
		return nil, fmt.Errorf("%w: %d permits", driver.ErrInvalidOption, permits)
	}
	return l.acquire(ctx, key, sem, permits, o)
}

// Waiters returns how many contenders are queued for key, over all three
// kinds of lock, not counting holders.
func (l *Locker) Waiters(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for space := uint8(0); space < 3; space++ {
		if e := l.entries[entryKey{space, key}]; e != nil {
			n += len(e.queue)
		}
	}
	return n
}

// Inspect implements driver.Inspector. It reports the holders of all three
// kinds of lock on key (exclusive, read/write, semaphore), oldest grant
// first, and the waiters of all three.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inspectLocked(key, now), nil
}

func (l *Locker) inspectLocked(key string, now time.Time) driver.Inspection {
	var in driver.Inspection
	for space := uint8(0); space < 3; space++ {
		e := l.entries[entryKey{space, key}]
		if e == nil {
			continue
		}
		in.Waiters += len(e.queue)
		for _, h := range e.holders {
			if now.Before(h.expires) {
				in.Holders = append(in.Holders, driver.Holding{Owner: h.owner, Token: h.token, TTL: h.expires.Sub(now)})
			}
		}
	}
	slices.SortFunc(in.Holders, func(a, b driver.Holding) int { return cmp.Compare(a.Token, b.Token) })
	return in
}

// List implements driver.Lister.
func (l *Locker) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: list limit %d", driver.ErrInvalidOption, limit)
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var keys []string
	for k := range l.entries {
		if strings.HasPrefix(k.key, prefix) && k.key > after {
			keys = append(keys, k.key)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys) // a key may have entries of several kinds
	var out []driver.Listed
	for _, k := range keys {
		if len(out) == limit {
			break
		}
		if in := l.inspectLocked(k, now); len(in.Holders) > 0 {
			out = append(out, driver.Listed{Key: k, Inspection: in})
		}
	}
	return out, nil
}

// ForceRelease implements driver.ForceReleaser for every kind of lock on
// key that Inspect reports (exclusive, read/write, semaphore): tokens come
// from one counter per Locker, so the token target names is one holding of
// one of them, and the next grant's token is greater anyway. The old
// holder's next Refresh finds its lease gone.
func (l *Locker) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var removed []driver.Holding
	for space := uint8(0); space < 3; space++ {
		e := l.entries[entryKey{space, key}]
		if e == nil {
			continue
		}
		e.expire(now)
		kept := e.holders[:0]
		for _, h := range e.holders {
			held := driver.Holding{Owner: h.owner, Token: h.token, TTL: h.expires.Sub(now)}
			if target.AnyHolder || target.Matches(held) {
				removed = append(removed, held)
			} else {
				kept = append(kept, h)
			}
		}
		e.holders = kept
		l.dispatch(e, now)
	}
	if len(removed) == 0 {
		if in := l.inspectLocked(key, now); len(in.Holders) > 0 {
			return nil, driver.HolderChanged(in.Holders)
		}
		return nil, nil
	}
	slices.SortFunc(removed, func(a, b driver.Holding) int { return cmp.Compare(a.Token, b.Token) })
	return removed, nil
}

func (l *Locker) acquire(ctx context.Context, key string, k kind, permits int, o driver.AcquireOptions) (driver.Lease, error) {
	if o.TTL <= 0 {
		return nil, fmt.Errorf("%w: ttl %v", driver.ErrInvalidOption, o.TTL)
	}
	ek := entryKey{k.space(), key}
	now := time.Now()
	l.mu.Lock()
	e := l.entry(ek)
	e.expire(now)
	// Only when nobody is queued: a newcomer must not overtake waiters.
	if len(e.queue) == 0 && e.grantable(k, permits) {
		lease := l.grant(e, k, o.TTL, o.Owner, now)
		l.mu.Unlock()
		return lease, nil
	}
	if !o.Wait {
		l.idle(e)
		l.mu.Unlock()
		return nil, driver.ErrNotAcquired
	}
	w := &waiter{kind: k, permits: permits, ttl: o.TTL, owner: o.Owner, ready: make(chan struct{})}
	e.queue = append(e.queue, w)
	l.schedule(e, now)
	l.mu.Unlock()

	select {
	case <-w.ready:
		return &lease{l: l, e: e, token: w.token, expires: w.expires}, nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-w.ready:
		// Granted as ctx ended: give it back, so nothing is left behind.
		e.drop(w.token)
	default:
		for i, q := range e.queue {
			if q == w {
				e.queue = append(e.queue[:i], e.queue[i+1:]...)
				break
			}
		}
	}
	l.dispatch(e, time.Now())
	return nil, ctx.Err()
}

// entry returns the entry for k, reusing an idle one.
func (l *Locker) entry(k entryKey) *entry {
	if e := l.entries[k]; e != nil {
		e.idleSeq = 0
		return e
	}
	var e *entry
	if n := len(l.free); n > 0 {
		e, l.free = l.free[n-1], l.free[:n-1]
	} else {
		e = &entry{}
	}
	e.key, e.live = k, true
	l.entries[k] = e
	return e
}

// idle marks e idle when nothing holds or waits on it, and forgets the
// entry that fell idle maxIdle times ago if it is idle still.
func (l *Locker) idle(e *entry) {
	if len(e.holders) > 0 || len(e.queue) > 0 || e.idleSeq != 0 {
		return
	}
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil // its callback names the old generation
		e.timerAt = time.Time{}
	}
	e.gen++
	e.holders = e.holders[:0]
	l.idleSeq++
	e.idleSeq = l.idleSeq
	old := l.idleRing[l.idleAt]
	l.idleRing[l.idleAt] = idleEntry{e: e, seq: e.idleSeq}
	l.idleAt = (l.idleAt + 1) % maxIdle
	if old.e != nil && old.e.idleSeq == old.seq {
		delete(l.entries, old.e.key)
		old.e.idleSeq, old.e.live = 0, false
		if len(l.free) < maxIdle {
			l.free = append(l.free, old.e)
		}
	}
}

func (l *Locker) grant(e *entry, k kind, ttl time.Duration, owner string, now time.Time) *lease {
	l.token++
	expires := now.Add(ttl)
	e.holders = append(e.holders, holder{token: l.token, shared: k == rwRead || k == sem, expires: expires, owner: owner})
	return &lease{l: l, e: e, token: l.token, expires: expires}
}

// dispatch grants the lock to waiters at the head of the queue, in order,
// for as long as they fit: one writer, or a run of readers, or permits.
func (l *Locker) dispatch(e *entry, now time.Time) {
	e.expire(now)
	for len(e.queue) > 0 {
		w := e.queue[0]
		if !e.grantable(w.kind, w.permits) {
			break
		}
		e.queue = e.queue[1:]
		g := l.grant(e, w.kind, w.ttl, w.owner, now)
		w.token, w.expires = g.token, g.expires
		close(w.ready)
	}
	l.schedule(e, now)
	l.idle(e)
}

// schedule arms e's timer for the earliest holder expiry while someone
// waits, so the waiter of a holder that vanished is woken when its lease
// runs out.
func (l *Locker) schedule(e *entry, now time.Time) {
	if len(e.queue) == 0 || len(e.holders) == 0 {
		return
	}
	first := e.holders[0].expires
	for _, h := range e.holders[1:] {
		if h.expires.Before(first) {
			first = h.expires
		}
	}
	if !e.timerAt.IsZero() && !e.timerAt.After(first) {
		// Set to fire no later: firing early only dispatches and sets it
		// again, and under contention this spares a timer reset on every
		// handoff.
		return
	}
	e.timerAt = first
	if e.timer == nil {
		gen := e.gen
		e.timer = time.AfterFunc(first.Sub(now), func() { l.expired(e, gen) })
		return
	}
	e.timer.Reset(first.Sub(now))
}

func (l *Locker) expired(e *entry, gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.gen == gen {
		e.timerAt = time.Time{}
		l.dispatch(e, time.Now())
	}
}

// expire drops holders whose lease ran out.
func (e *entry) expire(now time.Time) {
	kept := e.holders[:0]
	for _, h := range e.holders {
		if now.Before(h.expires) {
			kept = append(kept, h)
		}
	}
	e.holders = kept
}

func (e *entry) grantable(k kind, permits int) bool {
	switch k {
	case rwRead:
		for _, h := range e.holders {
			if !h.shared {
				return false
			}
		}
		return true
	case sem:
		return len(e.holders) < permits
	}
	return len(e.holders) == 0
}

// find returns the index of token among the live holders, or -1.
func (e *entry) find(token uint64) int {
	for i, h := range e.holders {
		if h.token == token {
			return i
		}
	}
	return -1
}

func (e *entry) drop(token uint64) bool {
	i := e.find(token)
	if i < 0 {
		return false
	}
	e.holders = append(e.holders[:i], e.holders[i+1:]...)
	return true
}

// lease is one grant. It keeps the entry it was granted on, rather than
// its key, so that a release or a renewal finds it without a look-up in
// the map (a hash of the key each).
type lease struct {
	l       *Locker
	e       *entry
	token   uint64
	expires time.Time // guarded by l.mu
	// released: Release gave the holding up (guarded by l.mu).
	released bool
}

// entryLocked returns the entry s was granted on while the Locker keeps
// it, or nil once it was let go of, with s's holding (an entry that holds
// anything stays in the map). An entry is reused once let go of, maybe for
// another key: s's token, which no other grant carries, is what tells
// whether it still holds s. Called with l.mu held.
func (s *lease) entryLocked() *entry {
	if s.e.live {
		return s.e
	}
	return nil
}

func (s *lease) Token() uint64 { return s.token }

func (s *lease) Expiry() time.Time {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	return s.expires
}

func (s *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	now := time.Now()
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	return s.refreshLocked(ttl, now)
}

func (s *lease) refreshLocked(ttl time.Duration, now time.Time) error {
	e := s.entryLocked()
	if e == nil {
		return s.gone(now)
	}
	e.expire(now)
	i := e.find(s.token)
	if i < 0 {
		s.l.dispatch(e, now)
		return s.gone(now)
	}
	s.expires = now.Add(ttl)
	e.holders[i].expires = s.expires
	s.l.schedule(e, now)
	return nil
}

// RefreshBatch implements driver.BatchRefresher: one pass under the
// Locker's mutex instead of one per lease.
func (l *Locker) RefreshBatch(ctx context.Context, leases []driver.Lease, ttl time.Duration) []error {
	errs := make([]error, len(leases))
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, dl := range leases {
		s, ok := dl.(*lease)
		if !ok || s.l != l {
			errs[i] = fmt.Errorf("%w: a lease of another Locker", driver.ErrInvalidOption)
			continue
		}
		errs[i] = s.refreshLocked(ttl, now)
	}
	return errs
}

func (s *lease) Release(ctx context.Context) error {
	now := time.Now()
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	e := s.entryLocked()
	if e == nil {
		return s.gone(now)
	}
	e.expire(now)
	held := e.drop(s.token)
	s.l.dispatch(e, now)
	if !held {
		return s.gone(now)
	}
	s.released = true
	return nil
}

// gone is the error of a lease whose holding is no longer there, with the
// Locker's mutex held: it ran out, or was taken away before that, as only
// ForceRelease does, which the lease's own deadline tells apart. Its
// holder's section is cancelled with this as the cause, which an operator's
// release should not read as an expiry.
func (s *lease) gone(now time.Time) error {
	switch {
	case s.released:
		return fmt.Errorf("%w: released already", driver.ErrNotHeld)
	case now.Before(s.expires):
		return fmt.Errorf("%w: released before it expired, by ForceRelease (an operator)", driver.ErrNotHeld)
	}
	return fmt.Errorf("%w: expired", driver.ErrNotHeld)
}

// Ping implements driver.Pinger: an in-process backend always answers.
func (l *Locker) Ping(context.Context) error { return nil }

// BoundedByContext reports true: every call returns once its ctx is done,
// since nothing leaves the process (driver.ContextBounded).
func (l *Locker) BoundedByContext() bool { return true }

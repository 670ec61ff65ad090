package guard

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// keeper owns the life of every lease a Guard holds.
//
// Each lease has a conservative expiry, driver.Lease.Expiry: the send time of
// the request that last granted or renewed it, plus its TTL. A lease that no
// renewal has confirmed by a safety margin before that instant is declared
// lost on a timer, whatever a renewal in flight is doing, so a client that
// ignores deadlines cannot delay the loss.
//
// Leases renewed one by one (Redis, RedLock, SQL, memory) sit in one heap
// under one timer: holding a lock costs no goroutine and no timer of its own.
// When a renewal falls due, every lease due within the next renewal period is
// renewed with it, in one request where the backend batches, so the leases
// fall into step and the requests per period stay constant as locks grow.
//
// A lease enters that heap only when the timer first fires after its grant,
// at the latest when its first renewal falls due. Until then it sits on a
// stack of young leases, pushed without the keeper's mutex, and an Unlock
// takes it off by marking it: most sections end long before a third of
// their TTL, and then cost the keeper neither its mutex nor a heap
// operation. The timer is armed no later than the renewal of any young
// lease, and the renewal comes before the loss deadline, so no loss is
// declared later for it. The stack is emptied whenever it grows past
// maxYoung, which bounds the unlocked leases it keeps.
//
// Leases kept alive by a backend session (etcd, ZooKeeper, Consul) are
// never renewed here: the keeper watches each session once, with one timer
// and one goroutine per session, and loses all of its leases together.
type keeper struct {
	g        *Guard
	mu       sync.Mutex
	locks    lockHeap
	timer    *time.Timer
	sessions map[driver.Session]*sessionWatch
	// failing holds the error of the last renewal of each lock in the heap
	// whose renewals fail, and when it is retried, so that a held Lock
	// carries no room for them.
	failing map[*Lock]failure

	// young is the top of the stack of young locks, linked by Lock.next.
	young atomic.Pointer[Lock]
	// armedAt is when the timer fires (nanos), 0 when idle. Written with
	// the mutex held; add reads it without.
	armedAt atomic.Int64
	// base is the origin of the keeper's times (nanos).
	base time.Time
}

// Lock.state: where the keeper keeps a lock.
const (
	lockOut     int32 = iota // in no structure of the keeper (the heap's own index tells)
	lockYoung                // on the young stack
	lockKept                 // moved from the young stack into the heap
	lockSession              // among its session's locks (keeper.sessions), at its index
)

// failure is the last failed renewal of a lock whose renewals fail.
type failure struct {
	err   error
	retry int64 // when it is retried (nanos); 0 once its lease's expiry moved without it
}

// maxYoung bounds the young stack: the acquisition that finds it this deep
// moves its locks into the heap, and drops the unlocked ones.
const maxYoung = 64

// retryDivisor spaces the retries of a failed renewal: a tenth of the TTL,
// so several fit before the loss deadline.
const retryDivisor = 10

// maxRenewals bounds the renewals in flight at once on a backend that
// renews one lease per request.
const maxRenewals = 32

func (k *keeper) add(l *Lock) {
	// The backend read the clock for the grant already; Held shows it.
	exp := k.nanos(l.lease.Expiry())
	l.granted = exp - int64(l.ttl)
	if sl, ok := l.lease.(driver.SessionLease); ok {
		k.addToSession(l, sl.Session())
		if rl, ok := sl.(driver.RevocableLease); ok {
			// Outside the keeper's mutex: f may run at once, and loses l.
			rl.OnRevoke(l.revoked)
		}
		return
	}
	// Nobody else sees l before it is pushed: no mutex for its fields,
	// and none read after it (the keeper may renew it at once).
	due := exp + firstDue(l.ttl)
	l.expiry = exp
	l.state.Store(lockYoung)
	var depth uint8
	for {
		top := k.young.Load()
		depth = 1
		if top != nil {
			depth = min(top.depth, maxYoung-1) + 1
		}
		l.next, l.depth = top, depth
		if k.young.CompareAndSwap(top, l) {
			break
		}
	}
	// Pushed before armedAt is read: a timer that fires meanwhile clears
	// armedAt before it empties the stack, so either it takes l, or this
	// reads 0 and arms the timer again.
	if a := k.armedAt.Load(); a != 0 && a <= due && depth < maxYoung {
		return
	}
	k.mu.Lock()
	if depth >= maxYoung {
		k.drainLocked()
	}
	k.armAtLocked(due)
	k.mu.Unlock()
}

// nanos is t as nanoseconds from the keeper's base, on the monotonic clock
// when t carries a reading of it; never 0, which armedAt keeps for idle.
// The keeper's times are kept so: integer arithmetic costs less than
// time.Time's, and a held Lock carries 8 bytes for each, not 24.
func (k *keeper) nanos(t time.Time) int64 {
	return max(int64(t.Sub(k.base)), 1)
}

// time is the instant n (nanos) stands for.
func (k *keeper) time(n int64) time.Time { return k.base.Add(time.Duration(n)) }

// now is the current time in nanos.
func (k *keeper) now() int64 { return k.nanos(time.Now()) }

// drainLocked moves the young locks still held into the heap and lets go
// of the others. Called with the keeper's mutex held.
func (k *keeper) drainLocked() {
	l := k.young.Swap(nil)
	if l == nil {
		return
	}
	for l != nil {
		next := l.next
		l.next = nil
		if l.state.CompareAndSwap(lockYoung, lockKept) {
			heap.Push(&k.locks, l)
		}
		l = next
	}
}

// youngLocked calls f for each lock on the young stack still held. Called
// with the keeper's mutex held, which keeps the stack's links still.
func (k *keeper) youngLocked(f func(*Lock)) {
	for l := k.young.Load(); l != nil; l = l.next {
		if l.state.Load() == lockYoung {
			f(l)
		}
	}
}

// overdue reports whether l's lease may have expired unrenewed: now is past
// its conservative expiry (or its session's) less the margin.
func (k *keeper) overdue(l *Lock, now time.Time) bool {
	deadline := k.nanos(l.lease.Expiry())
	k.mu.Lock()
	if l.state.Load() != lockSession && l.expiry > deadline {
		deadline = l.expiry
	}
	k.mu.Unlock()
	return k.nanos(now) >= deadline-int64(k.g.marginFor(l.ttl))
}

func (k *keeper) remove(l *Lock) {
	if l.state.CompareAndSwap(lockYoung, lockOut) {
		// Still young: the stack lets go of it when it is next emptied.
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.state.Load() == lockSession {
		k.removeFromSessionLocked(l)
		return
	}
	if l.index >= 0 {
		heap.Remove(&k.locks, int(l.index))
	}
	delete(k.failing, l)
}

// at is when the keeper must next look at l (nanos): its renewal, or the
// loss deadline when that comes first or a renewal is already in flight.
// It orders the heap: whoever changes what it reads on a lock in the heap
// fixes the lock's place.
func (l *Lock) at() int64 {
	at := l.lossAt()
	if due := l.due(); !l.refreshing && due < at {
		at = due
	}
	return at
}

// due is when l's next renewal falls due (nanos): a third of its TTL
// after the grant or its last renewal, or the retry of a failed one.
// Computed, not kept, so that a held Lock carries no room for it. Called
// with the keeper's mutex held.
func (l *Lock) due() int64 {
	if failing := l.g.keeper.failing; len(failing) > 0 {
		// A lookup only while renewals fail: due orders the heap.
		if f, ok := failing[l]; ok && f.retry != 0 {
			return f.retry
		}
	}
	return l.expiry + firstDue(l.ttl)
}

// lossAt is when l is declared lost unless renewed (nanos): its expiry
// less the margin.
func (l *Lock) lossAt() int64 { return l.expiry - int64(l.g.marginFor(l.ttl)) }

// firstDue is when a lease's first renewal falls due, less its expiry: a
// third of its TTL after the grant.
func firstDue(ttl time.Duration) int64 { return int64(-ttl + ttl/3) }

// armLocked makes the timer fire for the earliest lock. A timer armed for
// later is moved earlier; one armed earlier is left, since firing early only
// re-arms. So a lock taken and released in a loop resets no timer.
func (k *keeper) armLocked() {
	if len(k.locks) == 0 {
		return
	}
	k.armAtLocked(k.locks[0].at())
}

// armAtLocked makes the timer fire at at (nanos), or earlier.
func (k *keeper) armAtLocked(at int64) {
	if a := k.armedAt.Load(); a != 0 && a <= at {
		return
	}
	k.armedAt.Store(max(at, 1))
	d := time.Duration(at - k.now())
	if k.timer == nil {
		k.timer = time.AfterFunc(d, k.fire)
	} else {
		k.timer.Reset(d)
	}
}

func (k *keeper) fire() {
	now := k.now()
	_, batches := k.g.locker.(driver.BatchRefresher)
	var lost, renew, later []*Lock
	k.mu.Lock()
	// Cleared before the stack is taken: see add.
	k.armedAt.Store(0)
	k.drainLocked()
	for len(k.locks) > 0 && k.locks[0].at() <= now {
		l := heap.Pop(&k.locks).(*Lock)
		// A renewal may have moved the lease's expiry without its result
		// being taken yet (a large batch is still being applied): the
		// lease's own Expiry is the truth.
		if e := k.nanos(l.lease.Expiry()); e > l.expiry {
			l.expiry = e
			if f, ok := k.failing[l]; ok {
				// Due from the new expiry, not on the failure's retry.
				f.retry = 0
				k.failing[l] = f
			}
		}
		if now >= l.lossAt() {
			lost = append(lost, l)
			continue
		}
		if l.refreshing {
			// Its renewal is in flight and has already succeeded; its
			// result will schedule it.
			later = append(later, l)
			continue
		}
		renew = append(renew, l)
	}
	if batches && len(renew) > 0 {
		// Bring forward every renewal due within the coming period, so that
		// it goes in the same request and falls into step with the others.
		window := now + int64(renew[0].ttl/3)
		for len(k.locks) > 0 && k.locks[0].at() <= window {
			l := heap.Pop(&k.locks).(*Lock)
			if l.refreshing || l.due() > now+int64(l.ttl/3) {
				later = append(later, l)
				continue
			}
			renew = append(renew, l)
		}
	}
	for _, l := range renew {
		l.refreshing = true
		heap.Push(&k.locks, l)
	}
	for _, l := range later {
		heap.Push(&k.locks, l)
	}
	// Lost locks stay out of the heap: lose, or their Unlock, ends them.
	for _, l := range lost {
		l.index = -1
	}
	causes := make([]error, len(lost))
	for i, l := range lost {
		causes[i] = l.expiredCause(k.g.marginFor(l.ttl), k.failing[l].err)
		delete(k.failing, l)
	}
	k.armLocked()
	k.mu.Unlock()

	for i, l := range lost {
		l.lose(causes[i])
	}
	if len(renew) > 0 {
		go k.renew(renew)
	}
}

// expiredCause says why a lease was declared lost on its deadline. Called
// with the keeper's mutex held.
func (l *Lock) expiredCause(margin time.Duration, lastErr error) error {
	if lastErr != nil {
		return fmt.Errorf("not renewed within %v of its expiry: %w", margin, lastErr)
	}
	if l.refreshing {
		return fmt.Errorf("not renewed within %v of its expiry: the renewal sent has not been answered", margin)
	}
	return fmt.Errorf("not renewed within %v of its expiry", margin)
}

// renew renews locks: in one call per TTL when the backend batches, else
// concurrently, so one slow lease does not hold up the others. Each call's
// deadline is the latest loss deadline of the leases in it, the last point
// where its answer can still help one of them: a lease whose own deadline
// comes first is declared lost by the keeper's timer on that deadline, not
// by the call, so a slow batch costs only the leases it was too slow for.
// The price is paid by a batch that never answers (a connection dropped
// without a word while the server stays reachable on others): it is not
// sent again on another before the last of its leases is lost, where a
// batch cut at its earliest deadline would have given the later ones a
// retry. A slow batch is the likelier of the two (a loaded database
// renewing tens of thousands of rows), and retries could not save it.
func (k *keeper) renew(locks []*Lock) {
	if br, ok := k.g.locker.(driver.BatchRefresher); ok {
		// One call per TTL, on runs of locks sorted in place: grouping
		// them in a map would copy every lock of a large renewal, which is
		// heap held while the batch is in flight.
		slices.SortFunc(locks, func(a, b *Lock) int { return cmp.Compare(a.ttl, b.ttl) })
		for len(locks) > 0 {
			n := 1
			for n < len(locks) && locks[n].ttl == locks[0].ttl {
				n++
			}
			group, ttl := locks[:n], locks[0].ttl
			locks = locks[n:]
			leases := make([]driver.Lease, len(group))
			// Under one hold of the mutex, not one per lease.
			k.mu.Lock()
			deadline := group[0].lossAt()
			for i, l := range group {
				leases[i] = l.lease
				deadline = max(deadline, l.lossAt())
			}
			k.mu.Unlock()
			ctx, cancel := context.WithDeadline(context.Background(), k.time(deadline))
			errs := br.RefreshBatch(ctx, leases, ttl)
			cancel()
			k.g.tel.renewalRequests.Add(context.Background(), 1, k.g.tel.byResult[batchOK(errs)]...)
			k.renewedBatch(group, errs)
		}
		return
	}
	// At most maxRenewals at once: goroutines stay bounded however many
	// locks fall due together, and a renewal that hangs holds one slot
	// while the loss deadline, not its answer, decides its lock's fate.
	slots := make(chan struct{}, maxRenewals)
	var wg sync.WaitGroup
	for _, l := range locks {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			ctx, cancel := context.WithDeadline(context.Background(), l.lossDeadline())
			err := l.lease.Refresh(ctx, l.ttl)
			cancel()
			k.g.tel.renewalRequests.Add(context.Background(), 1, k.g.tel.byResult[err == nil]...)
			k.renewed(l, err)
		})
	}
	wg.Wait()
}

// batchOK reports whether a batch renewal was answered: some lease renewed,
// or every refusal was the backend's own (not a failure to reach it).
func batchOK(errs []error) bool {
	for _, err := range errs {
		if err == nil || errors.Is(err, ErrNotHeld) {
			return true
		}
	}
	return len(errs) == 0
}

// lossDeadline reads, under the keeper's mutex, when l is lost unless renewed.
func (l *Lock) lossDeadline() time.Time {
	k := &l.g.keeper
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.time(l.lossAt())
}

// renewed takes the result of l's renewal.
func (k *keeper) renewed(l *Lock, err error) {
	k.mu.Lock()
	lose := k.renewedLocked(l, err)
	k.armLocked()
	k.mu.Unlock()
	if lose {
		l.lose(err)
	}
}

// renewedBatch takes the results of a batch renewal under one hold of the
// mutex, so that thousands of results are applied at once rather than one
// by one between the timer's checks.
func (k *keeper) renewedBatch(locks []*Lock, errs []error) {
	var lost []*Lock
	var causes []error
	k.mu.Lock()
	for i, l := range locks {
		err := errors.New("the backend returned no result for this lease")
		if i < len(errs) {
			err = errs[i]
		}
		if k.renewedLocked(l, err) {
			lost, causes = append(lost, l), append(causes, err)
		}
	}
	k.armLocked()
	k.mu.Unlock()
	for i, l := range lost {
		l.lose(causes[i])
	}
}

// renewedLocked applies the result of l's renewal, with the keeper's mutex
// held, and reports whether l is lost for it (the caller loses it after
// letting go of the mutex).
func (k *keeper) renewedLocked(l *Lock, err error) bool {
	g := k.g
	if err != nil {
		g.tel.refreshFailures.Add(context.Background(), 1, g.tel.onBackend...)
	}
	l.refreshing = false
	if l.index < 0 {
		// Unlocked, or declared lost, while the renewal was in flight.
		return false
	}
	if errors.Is(err, ErrNotHeld) {
		heap.Remove(&k.locks, int(l.index))
		delete(k.failing, l)
		return true
	}
	if err == nil {
		delete(k.failing, l)
		l.expiry = k.nanos(l.lease.Expiry())
	} else {
		if k.failing == nil {
			k.failing = map[*Lock]failure{}
		}
		k.failing[l] = failure{err: err, retry: k.now() + int64(l.ttl/retryDivisor)}
		g.logger.Warn("warden: renewal failed; retrying until the lease's loss deadline",
			"key", l.key, "backend", g.backend, "deadline", k.time(l.lossAt()), "error", err)
	}
	heap.Fix(&k.locks, int(l.index))
	return false
}

// sessionWatch watches one backend session for the locks it keeps alive.
type sessionWatch struct {
	k    *keeper
	sess driver.Session
	// locks are the session's locks, each at its Lock.index: a slice, not
	// a set, costs a held lock one word and its acquisition no hashing.
	locks  []*Lock
	margin time.Duration // the largest margin of its locks so far
	timer  *time.Timer
	armed  bool
}

func (k *keeper) addToSession(l *Lock, s driver.Session) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.sessions == nil {
		k.sessions = map[driver.Session]*sessionWatch{}
	}
	sw := k.sessions[s]
	if sw == nil {
		sw = &sessionWatch{k: k, sess: s}
		k.sessions[s] = sw
		go sw.watch()
	}
	l.index = int32(len(sw.locks))
	sw.locks = append(sw.locks, l)
	sw.margin = max(sw.margin, k.g.marginFor(l.ttl))
	l.state.Store(lockSession)
	if !sw.armed {
		sw.arm()
	}
}

// removeFromSessionLocked takes l off its session's locks. A held Lock
// keeps no pointer to its session's watch: it is found by the lease's
// session, unless the session is gone, and with it the watch and its locks.
// Called with the keeper's mutex held.
func (k *keeper) removeFromSessionLocked(l *Lock) {
	sw := k.sessions[l.lease.(driver.SessionLease).Session()]
	if sw == nil || l.index < 0 || int(l.index) >= len(sw.locks) || sw.locks[l.index] != l {
		l.index = -1
		l.state.Store(lockOut)
		return
	}
	sw.remove(l)
}

// arm sets the timer for the session's loss deadline. Called with the
// keeper's mutex held.
func (sw *sessionWatch) arm() {
	d := time.Until(sw.sess.Expiry().Add(-sw.margin))
	sw.armed = true
	if sw.timer == nil {
		sw.timer = time.AfterFunc(d, sw.check)
	} else {
		sw.timer.Reset(d)
	}
}

// remove takes l off the session. Called with the keeper's mutex held.
func (sw *sessionWatch) remove(l *Lock) {
	last := len(sw.locks) - 1
	sw.locks[l.index] = sw.locks[last]
	sw.locks[l.index].index = l.index
	sw.locks[last] = nil
	sw.locks = sw.locks[:last]
	l.index = -1
	l.state.Store(lockOut)
	if len(sw.locks) == 0 && sw.timer != nil {
		sw.timer.Stop()
		sw.armed = false
	}
}

// check runs at the session's loss deadline as last known: a session renewed
// since has moved its expiry, and the timer is set again for it.
func (sw *sessionWatch) check() {
	k := sw.k
	k.mu.Lock()
	sw.armed = false
	if len(sw.locks) == 0 {
		k.mu.Unlock()
		return
	}
	if time.Now().Before(sw.sess.Expiry().Add(-sw.margin)) {
		sw.arm()
		k.mu.Unlock()
		return
	}
	margin := sw.margin // addToSession raises it under the mutex
	k.mu.Unlock()
	sw.loseAll(fmt.Errorf("the backend session was not renewed within %v of its expiry", margin))
}

// watch loses every lock of the session the moment the backend reports the
// session gone, and forgets the session.
func (sw *sessionWatch) watch() {
	<-sw.sess.Done()
	k := sw.k
	k.mu.Lock()
	delete(k.sessions, sw.sess)
	k.mu.Unlock()
	sw.loseAll(errors.New("the backend reported its session lost"))
	// Forgotten, it is not found to take its locks off it: let go of
	// them, and of its timer.
	k.mu.Lock()
	sw.locks = nil
	if sw.timer != nil {
		sw.timer.Stop()
		sw.armed = false
	}
	k.mu.Unlock()
}

func (sw *sessionWatch) loseAll(cause error) {
	k := sw.k
	k.mu.Lock()
	locks := slices.Clone(sw.locks)
	k.mu.Unlock()
	for _, l := range locks {
		l.lose(cause)
	}
}

// lockHeap orders locks by when the keeper must next look at them.
type lockHeap []*Lock

func (h lockHeap) Len() int           { return len(h) }
func (h lockHeap) Less(i, j int) bool { return h[i].at() < h[j].at() }
func (h lockHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = int32(i)
	h[j].index = int32(j)
}
func (h *lockHeap) Push(x any) {
	l := x.(*Lock)
	l.index = int32(len(*h))
	*h = append(*h, l)
}
func (h *lockHeap) Pop() any {
	old := *h
	n := len(old)
	l := old[n-1]
	old[n-1] = nil
	l.index = -1
	*h = old[:n-1]
	return l
}

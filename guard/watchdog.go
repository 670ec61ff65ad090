package guard

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"
)

// watchdog keeps every lease a Guard holds alive, refreshing each at a third
// of its TTL. One timer serves all of them (a heap ordered by next refresh),
// so holding a lock costs no goroutine and no timer of its own, and backends
// that refresh in batches get all the leases due at once.
//
// A refresh that returns ErrNotHeld loses the lock at once. Any other failure
// is retried until the lease would have expired on the server, counted from
// when the last successful refresh was sent: past that point another owner
// may hold it, so the lock is lost.
type watchdog struct {
	g     *Guard
	mu    sync.Mutex
	locks lockHeap
	timer *time.Timer
	armed time.Time // when the timer fires; zero when stopped
}

func (w *watchdog) add(l *Lock, sent time.Time) {
	w.mu.Lock()
	l.validUntil = sent.Add(l.ttl)
	l.due = sent.Add(l.ttl / 3)
	heap.Push(&w.locks, l)
	w.armLocked()
	w.mu.Unlock()
}

func (w *watchdog) remove(l *Lock) {
	w.mu.Lock()
	if l.index >= 0 {
		heap.Remove(&w.locks, l.index)
	}
	w.mu.Unlock()
}

// armLocked makes the timer fire for the earliest due lock. A timer armed
// for later is moved earlier; one armed earlier is left, since firing early
// only re-arms.
func (w *watchdog) armLocked() {
	if len(w.locks) == 0 {
		return
	}
	due := w.locks[0].due
	if !w.armed.IsZero() && !w.armed.After(due) {
		return
	}
	w.armed = due
	d := time.Until(due)
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.fire)
	} else {
		w.timer.Reset(d)
	}
}

func (w *watchdog) fire() {
	now := time.Now()
	w.mu.Lock()
	w.armed = time.Time{}
	var due []*Lock
	for len(w.locks) > 0 && !w.locks[0].due.After(now) {
		due = append(due, heap.Pop(&w.locks).(*Lock))
	}
	w.armLocked()
	w.mu.Unlock()
	if len(due) > 0 {
		go w.refresh(due)
	}
}

// refresh refreshes due leases: in one call per TTL when the backend batches,
// else concurrently, so one slow lease does not delay the others.
func (w *watchdog) refresh(due []*Lock) {
	if br, ok := w.g.locker.(BatchRefresher); ok {
		byTTL := map[time.Duration][]*Lock{}
		for _, l := range due {
			byTTL[l.ttl] = append(byTTL[l.ttl], l)
		}
		for ttl, locks := range byTTL {
			leases := make([]Lease, len(locks))
			for i, l := range locks {
				leases[i] = l.lease
			}
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), ttl/3)
			errs := br.RefreshBatch(ctx, leases, ttl)
			cancel()
			for i, l := range locks {
				var err error
				if i < len(errs) {
					err = errs[i]
				}
				w.done(l, sent, err)
			}
		}
		return
	}
	var wg sync.WaitGroup
	for _, l := range due {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), l.ttl/3)
			err := l.lease.Refresh(ctx, l.ttl)
			cancel()
			w.done(l, sent, err)
		}()
	}
	wg.Wait()
}

// done reschedules l after a refresh sent at sent, or loses it.
func (w *watchdog) done(l *Lock, sent time.Time, err error) {
	if err != nil {
		w.g.tel.refreshFailures.Add(context.Background(), 1, w.g.tel.onBackend...)
	}
	l.mu.Lock()
	live := l.holds > 0 && l.lostErr == nil
	l.mu.Unlock()
	if !live {
		return
	}
	if errors.Is(err, ErrNotHeld) {
		l.lose(err)
		return
	}
	w.mu.Lock()
	if err == nil {
		l.validUntil = sent.Add(l.ttl)
		l.due = sent.Add(l.ttl / 3)
	} else {
		// Retry soon, but give up while the server may still count the
		// lease as ours: losing it late would let two owners run.
		retry := time.Now().Add(l.ttl / 10)
		if !retry.Before(l.validUntil) {
			w.mu.Unlock()
			w.g.logger.Warn("warden: refresh failing until the lease expired", "key", l.key, "backend", w.g.backend, "error", err)
			l.lose(err)
			return
		}
		w.g.logger.Warn("warden: refresh failed; retrying", "key", l.key, "backend", w.g.backend, "error", err)
		l.due = retry
	}
	// The lock may have been unlocked while its refresh was in flight.
	l.mu.Lock()
	live = l.holds > 0 && l.lostErr == nil
	l.mu.Unlock()
	if live && l.index < 0 {
		heap.Push(&w.locks, l)
		w.armLocked()
	}
	w.mu.Unlock()
}

// lockHeap orders locks by their next refresh.
type lockHeap []*Lock

func (h lockHeap) Len() int           { return len(h) }
func (h lockHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h lockHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *lockHeap) Push(x any) {
	l := x.(*Lock)
	l.index = len(*h)
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

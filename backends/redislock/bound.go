package redislock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// boundTick is how often the watchdog looks at the attempts in flight: an
// attempt is cut short between attemptBound and attemptBound+boundTick
// after it started.
const boundTick = attemptBound / 5

// errNoAnswer is the cause an attempt's context is cancelled with when it
// had no answer within attemptBound.
var errNoAnswer = errors.New("no answer within the attempt bound")

// watchdog cuts short the waiting attempts of a Locker that have no answer
// after attemptBound. One goroutine does it for all of them, looking every
// boundTick while any is in flight, rather than a timer per attempt
// (context.WithTimeout): arming a timer that becomes the process's earliest
// wakes a thread of the Go runtime to watch it, two futex calls on the
// path of every waiting acquisition, against one timer per boundTick here.
//
// The attempts in flight are a list in the order they started, linked
// through their flights, which their acquisitions keep: taking one in and
// out is a few pointer writes, with neither a map's hashing nor an
// allocation, on the path of every waiting acquisition, and the goroutine
// looks at the oldest only.
type watchdog struct {
	mu         sync.Mutex
	head, tail *flight
	running    bool
}

// flight is one attempt in flight, or the room for the attempts of one
// acquisition, one at a time.
type flight struct {
	start      time.Time
	cancel     context.CancelCauseFunc
	prev, next *flight
	linked     bool // on the watchdog's list
}

// begin returns the context of an attempt starting now, which f describes
// until end takes it back. f is the caller's, so that an acquisition's
// attempts share one.
func (w *watchdog) begin(ctx context.Context, f *flight) context.Context {
	actx, cancel := context.WithCancelCause(ctx)
	f.cancel = cancel
	w.mu.Lock()
	// Read under the mutex, so that the list is in the order of the
	// start times too.
	f.start = time.Now()
	f.prev, f.next, f.linked = w.tail, nil, true
	if w.tail != nil {
		w.tail.next = f
	} else {
		w.head = f
	}
	w.tail = f
	if !w.running {
		w.running = true
		go w.run()
	}
	w.mu.Unlock()
	return actx
}

// end ends the attempt of f.
func (w *watchdog) end(f *flight) {
	w.mu.Lock()
	if f.linked {
		w.unlinkLocked(f)
	}
	cancel := f.cancel
	w.mu.Unlock()
	cancel(nil)
}

// unlinkLocked takes f off the list. Called with the mutex held.
func (w *watchdog) unlinkLocked(f *flight) {
	if f.prev != nil {
		f.prev.next = f.next
	} else {
		w.head = f.next
	}
	if f.next != nil {
		f.next.prev = f.prev
	} else {
		w.tail = f.prev
	}
	f.prev, f.next, f.linked = nil, nil, false
}

// run cuts short the attempts past their bound, every boundTick, until none
// is in flight.
func (w *watchdog) run() {
	t := time.NewTicker(boundTick)
	defer t.Stop()
	for now := range t.C {
		w.mu.Lock()
		for f := w.head; f != nil && now.Sub(f.start) >= attemptBound; f = w.head {
			f.cancel(errNoAnswer)
			w.unlinkLocked(f)
		}
		if w.head == nil {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
}

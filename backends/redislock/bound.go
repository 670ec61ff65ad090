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
type watchdog struct {
	mu      sync.Mutex
	flights map[*flight]struct{}
	running bool
}

// flight is one attempt in flight.
type flight struct {
	start  time.Time
	cancel context.CancelCauseFunc
}

// begin returns the context of an attempt starting now, and its flight,
// which end takes back. It is a method, not a function begin returns,
// since a closure over the flight would cost an allocation more on the
// path of every waiting acquisition.
func (w *watchdog) begin(ctx context.Context) (context.Context, *flight) {
	actx, cancel := context.WithCancelCause(ctx)
	f := &flight{start: time.Now(), cancel: cancel}
	w.mu.Lock()
	if w.flights == nil {
		w.flights = make(map[*flight]struct{})
	}
	w.flights[f] = struct{}{}
	if !w.running {
		w.running = true
		go w.run()
	}
	w.mu.Unlock()
	return actx, f
}

// end ends the attempt of f.
func (w *watchdog) end(f *flight) {
	w.mu.Lock()
	delete(w.flights, f)
	w.mu.Unlock()
	f.cancel(nil)
}

// run cuts short the attempts past their bound, every boundTick, until none
// is in flight.
func (w *watchdog) run() {
	t := time.NewTicker(boundTick)
	defer t.Stop()
	for now := range t.C {
		w.mu.Lock()
		for f := range w.flights {
			if now.Sub(f.start) >= attemptBound {
				f.cancel(errNoAnswer)
				delete(w.flights, f)
			}
		}
		if len(w.flights) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
}

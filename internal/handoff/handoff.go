// Package handoff hands a call to a client that may ignore its context
// (go-redis with default options, pgx behind a black-holed connection) to
// a goroutine kept for such calls, so that its caller can stop waiting at
// the call's bound and answer for it while the call goes on in the
// background. guard bounds its backend calls with it, and idempotency its
// store calls.
//
// A Callers keeps the goroutines of one owner (a Guard, an Executor); Wait
// runs a Call on one of them.
package handoff

import (
	"context"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Grace is how long past a call's bound Wait waits for the call's own
// answer before it answers for it: long enough for a client that honours
// its context to return, short enough that a caller's bound holds within
// it. A client that ignores deadlines (go-redis without
// ContextTimeoutEnabled, which also retries a timed-out read) or detaches
// its requests from them (an etcd put run to its request timeout) is left
// behind.
const Grace = 20 * time.Millisecond

// maxIdleFor is how long a call goroutine waits idle for its next call,
// at most.
//
// Starting a goroutine per call is a large share of a fast client's cost:
// the goroutine's creation, and the growth of its stack through the
// client's calls, on every call (callgrind, go-redis: about 50,000 of
// 125,000 client instructions per uncontended guard.Do; 3.8 times the
// client instructions of idempotency's store calls made on the caller's
// goroutine, against 1.4 times with kept goroutines). So the goroutines
// are kept: each runs calls one after the other, and waits, idle, for the
// next one up to maxIdleFor; at most Callers.maxIdle wait so.
const maxIdleFor = time.Second

// Callers keeps an owner's idle call goroutines, the most recently idle
// last (it is the likeliest to have its stack grown and in cache). Its
// zero value keeps none and answers nil for a call that got no answer:
// Init sets both before its first use.
//
// One timer per Callers retires the idle, rather than one per goroutine:
// a goroutine that waited on its own timer put it in the runtime's timer
// heap each time it went idle and took it out each time it was woken, on
// every call (callgrind, redislock's uncontended guard cycle at
// GOMAXPROCS=2: about 80k client instructions with it, 71k without). The
// timer ticks every maxIdleFor/2 while any goroutine is idle, and retires
// those idle since before the previous tick.
type Callers struct {
	maxIdle  int   // set by Init, never changed
	noAnswer error // set by Init, never changed
	// left counts the calls whose waiter stopped waiting and that have
	// not yet returned (see MaxLeft).
	left   atomic.Int64
	mu     sync.Mutex
	idle   []*caller
	reaper *time.Timer // made on the first put; armed while idle is not empty
	armed  bool
	tick   uint64 // the reaper's ticks so far
}

// Init sets how many goroutines cs keeps idle (0: none, as an owner used
// in a testing/synctest bubble needs, where a goroutine left idle fails
// the test), and the error Wait returns for a call that got no answer
// within its bound and Grace: the owner's, so that its callers can match
// it with errors.Is. It must be called before cs is used.
func (cs *Callers) Init(maxIdle int, noAnswer error) {
	cs.maxIdle, cs.noAnswer = maxIdle, noAnswer
}

// caller is a goroutine that runs one call at a time.
//
// It is made idle again by the waiter of its call once that took the
// answer, or by itself when the waiter stopped waiting: so a call's answer
// is never taken by the next call's waiter, and its channels serve every
// call it runs, allocated once.
type caller struct {
	calls     chan task     // the next call, given only to an idle caller (nil: end): room for one, so that giving it never waits for the goroutine to run
	done      chan struct{} // the answer of its call is in the Call: room for one, always free when a call starts
	idleSince uint64        // the Callers' tick when it last went idle; guarded by Callers.mu
}

// task is a call given to a caller.
type task interface {
	// run makes the call and signals done when its waiter is still
	// waiting, or reports that it stopped waiting.
	run(done chan<- struct{}) (abandoned bool)
}

// Call is a call for Wait to run: F with Ctx and Arg.
//
// It is a function with its argument, rather than a closure: the functions
// are static, so that a call allocates only its Call, which its owner may
// embed in something the call needs anyway. A Call is used once.
type Call[A, T any] struct {
	Ctx context.Context
	F   func(context.Context, A) (T, error)
	Arg A
	// Late, if not nil, is given Arg and F's answer when that comes after
	// Wait stopped waiting for it, on the call's goroutine: so that what
	// the call did for a caller who is gone (a lease granted, a claim
	// made) is given back, never left behind.
	Late func(A, T, error)

	mu        sync.Mutex
	abandoned bool
	v         T
	err       error
}

func (c *Call[A, T]) run(done chan<- struct{}) bool {
	v, err := c.F(c.Ctx, c.Arg)
	c.mu.Lock()
	if !c.abandoned {
		c.v, c.err = v, err
		done <- struct{}{}
		c.mu.Unlock()
		return false
	}
	c.mu.Unlock()
	if c.Late != nil {
		c.Late(c.Arg, v, err)
	}
	return true
}

// answer is c's answer, taken from r once done signalled it: r is idle
// again, or ended when maxIdle are.
func (c *Call[A, T]) answer(cs *Callers, r *caller) (T, error) {
	if !cs.put(r) {
		r.calls <- nil
	}
	return c.v, c.err
}

// MaxLeft bounds the calls of one Callers left running once their waiters
// stopped waiting: a backend that answers none (a hung server, a client
// that ignores its context and retries) would otherwise keep a goroutine
// per call for as long as its client library waits, as many as calls come.
// Past it the backend is taken for down, and Wait answers at once, making
// no call, until some of them return.
const MaxLeft = 256

// Wait runs c on one of cs's goroutines, and returns its answer or, once
// c.Ctx is done and Grace has passed without one, the error given to Init:
// c then goes on in the background, and its answer goes to c.Late. While
// MaxLeft calls are left so, Wait makes no call and returns that error at
// once. c must not be used again.
func Wait[A, T any](cs *Callers, c *Call[A, T]) (T, error) {
	if cs.left.Load() >= MaxLeft {
		// The very error of a call left unanswered, which owners tell
		// apart by identity: no call was made, and none is left to answer
		// late.
		var zero T
		return zero, cs.noAnswer
	}
	ctx := c.Ctx
	r := cs.get()
	r.calls <- c
	select {
	case <-r.done:
		return c.answer(cs, r)
	case <-ctx.Done():
	}
	t := time.NewTimer(Grace)
	defer t.Stop()
	select {
	case <-r.done:
		return c.answer(cs, r)
	case <-t.C:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-r.done:
		return c.answer(cs, r)
	default:
	}
	c.abandoned = true
	cs.left.Add(1)
	var zero T
	return zero, cs.noAnswer
}

// get returns an idle caller, or starts one.
func (cs *Callers) get() *caller {
	cs.mu.Lock()
	if n := len(cs.idle); n > 0 {
		r := cs.idle[n-1]
		cs.idle[n-1] = nil
		cs.idle = cs.idle[:n-1]
		cs.mu.Unlock()
		return r
	}
	cs.mu.Unlock()
	r := &caller{calls: make(chan task, 1), done: make(chan struct{}, 1)}
	go r.run(cs)
	return r
}

// run runs the calls given to r, and ends when it is told to (by the
// reaper, or a waiter that found no room for it among the idle), or found
// no room itself after a call whose waiter stopped waiting.
func (r *caller) run(cs *Callers) {
	// Started by one call, it runs later ones too: the profiler labels it
	// inherited (pprof.Do) are that first call's, and would be charged
	// with the others' work.
	pprof.SetGoroutineLabels(context.Background())
	for t := range r.calls {
		if t == nil {
			return
		}
		if t.run(r.done) {
			cs.left.Add(-1)
			if !cs.put(r) {
				return
			}
		}
	}
}

// put makes r idle, unless maxIdle are.
func (cs *Callers) put(r *caller) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.idle) >= cs.maxIdle {
		return false
	}
	r.idleSince = cs.tick
	cs.idle = append(cs.idle, r)
	if !cs.armed {
		cs.armed = true
		if cs.reaper == nil {
			cs.reaper = time.AfterFunc(maxIdleFor/2, cs.reap)
		} else {
			cs.reaper.Reset(maxIdleFor / 2)
		}
	}
	return true
}

// reap is the reaper's tick: it ends the callers idle since before the
// previous tick (between maxIdleFor/2 and maxIdleFor), and arms the
// reaper again while some stay idle. The idle are in the order they went
// idle, so those to end are at the bottom.
func (cs *Callers) reap() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.tick++
	n := 0
	for n < len(cs.idle) && cs.tick-cs.idle[n].idleSince >= 2 {
		cs.idle[n].calls <- nil // idle, so its room is free
		n++
	}
	cs.idle = slices.Delete(cs.idle, 0, n)
	cs.armed = len(cs.idle) > 0
	if cs.armed {
		cs.reaper.Reset(maxIdleFor / 2)
	}
}

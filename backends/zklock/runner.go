package zklock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The client library's calls take no context: each blocks until the server
// answers or the connection is lost. So that a caller can return when its
// ctx ends or the request timeout passes, the call is made on another
// goroutine, a runner, which finishes it without the caller if need be.
// Runners are kept for the next request, with their timer: a request then
// costs a hand-over to a goroutine that is already waiting, rather than a
// goroutine start (whose stack must then grow to the depth of the library's
// calls) and a new timer.

// maxIdleRunners bounds the runners a Locker keeps waiting for work: as
// many as it had requests in flight at once, up to this many.
const maxIdleRunners = 16

// request is a call to make on a runner.
type request interface {
	// run makes the call.
	run()
	// abandoned follows run when the caller has stopped waiting: it undoes
	// what run made that nobody will use.
	abandoned()
}

// runners is a Locker's pool of idle runners.
type runners struct {
	mu     sync.Mutex
	idle   []*runner
	closed bool
}

// The states of a runner's current request.
const (
	stateRunning   int32 = iota
	stateAnswered        // run returned while the caller waited
	stateAbandoned       // the caller stopped waiting first
)

// runner is a goroutine that makes one request at a time. Between get and
// put it belongs to one caller, whose request timeout its timer counts.
type runner struct {
	pool  *runners
	work  chan request  // 1-buffered; closed to end the runner
	done  chan struct{} // 1-buffered; signalled when run returns, unless abandoned
	state atomic.Int32
	timer *time.Timer
}

// get returns an idle runner, or starts one.
func (p *runners) get() *runner {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		r := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return r
	}
	p.mu.Unlock()
	r := &runner{pool: p, work: make(chan request, 1), done: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	r.timer.Stop()
	go r.loop()
	return r
}

// put takes r back, its request over: it waits for the next one, or ends
// when enough others wait or the pool is closed.
func (p *runners) put(r *runner) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= maxIdleRunners {
		close(r.work)
		return
	}
	p.idle = append(p.idle, r)
}

// close ends the idle runners, and every other one as it comes back.
func (p *runners) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, r := range p.idle {
		close(r.work)
	}
	p.idle = nil
}

func (r *runner) loop() {
	for req := range r.work {
		req.run()
		if r.state.CompareAndSwap(stateRunning, stateAnswered) {
			r.done <- struct{}{}
			continue
		}
		req.abandoned()
		r.pool.put(r)
	}
}

// stopTimer stops r's timer and drains a tick that was already sent (with
// the asynchronous timer channels of a main module older than Go 1.23), so
// that the runner's next caller does not read it as its own timeout.
func (r *runner) stopTimer() {
	if !r.timer.Stop() {
		select {
		case <-r.timer.C:
		default:
		}
	}
}

// send makes req on a runner once a connection carries the session (see
// linked), and waits for it, for ctx and for the request timeout. It returns
// nil when req ran to its end for the caller, who then has its result, and
// otherwise the error that ended the wait: req then goes on without the
// caller, and is abandoned once it returns.
func (l *Locker) send(ctx context.Context, op string, req request) error {
	r := l.runners.get()
	r.timer.Reset(l.requestTimeout)
	if err := l.linked(ctx, op, r.timer.C); err != nil {
		r.stopTimer()
		l.runners.put(r)
		return err
	}
	r.state.Store(stateRunning)
	r.work <- req
	var cut error
	select {
	case <-r.done:
		r.stopTimer()
		l.runners.put(r)
		return nil
	case <-r.timer.C:
		cut = unavailable(op, fmt.Errorf("no answer within %v", l.requestTimeout))
	case <-ctx.Done():
		r.stopTimer()
		cut = ctx.Err()
	}
	if r.state.CompareAndSwap(stateRunning, stateAbandoned) {
		return cut
	}
	// Answered just now: the answer is the caller's after all.
	<-r.done
	l.runners.put(r)
	return nil
}

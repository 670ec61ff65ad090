package etcdlock

import (
	"context"
	"sync"
	"sync/atomic"
)

// A write that must not be cut short (see unbound) runs on a goroutine
// other than its caller's, so that the caller can return when its ctx
// ends. The Locker keeps those goroutines, its runners, for the next such
// write: a goroutine started per write begins with a small stack, which
// then grows, by copying, to the depth of a gRPC call, and that copying
// cost an acquisition more client CPU than anything else of the backend's
// own.

// maxIdleRunners bounds the runners a Locker keeps waiting: as many as it
// had such writes in flight at once, up to this many.
const maxIdleRunners = 16

// job is a write handed to a runner.
type job interface {
	// run makes the write.
	run()
	// abandoned follows run when the caller stopped waiting first: it
	// undoes what run did that nobody will use.
	abandoned()
}

// runners is a Locker's pool of idle runners.
type runners struct {
	mu     sync.Mutex
	idle   []*runner
	closed bool
}

// The states of a runner's job.
const (
	jobRunning   int32 = iota
	jobAnswered        // run returned while its caller waited
	jobAbandoned       // the caller stopped waiting first
)

// runner is a goroutine that runs one job at a time, for the caller that
// took it from the pool.
type runner struct {
	pool  *runners
	work  chan job      // 1-buffered; closed to end the runner
	done  chan struct{} // 1-buffered; signalled when a job's run returns, unless abandoned
	state atomic.Int32
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
	r := &runner{pool: p, work: make(chan job, 1), done: make(chan struct{}, 1)}
	go r.loop()
	return r
}

// put takes r back, its job over: it waits for the next, or ends when
// enough others wait or the pool is closed.
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
	for j := range r.work {
		j.run()
		if r.state.CompareAndSwap(jobRunning, jobAnswered) {
			r.done <- struct{}{}
			continue
		}
		j.abandoned()
		r.pool.put(r)
	}
}

// unboundCall is unbound's job: f, and what to do with its answer if nobody
// waits for it any more.
type unboundCall[T any] struct {
	f    func() (T, error)
	left func(T)
	v    T
	err  error
}

func (c *unboundCall[T]) run() { c.v, c.err = c.f() }

func (c *unboundCall[T]) abandoned() {
	if c.err == nil && c.left != nil {
		c.left(c.v)
	}
}

// unbound runs f, a request that must not be cut short when ctx ends (it
// keeps ctx's values only), and returns its answer; but once ctx is done,
// it returns ctx's error at once and leaves f to finish on a runner of p,
// where left is given f's answer if f succeeds. That is what keeps every
// call of the Locker within its ctx (driver.ContextBounded). A ctx that
// cannot end needs no runner: f then runs on the caller's goroutine.
func unbound[T any](ctx context.Context, p *runners, f func() (T, error), left func(T)) (T, error) {
	if ctx.Done() == nil {
		return f()
	}
	c := &unboundCall[T]{f: f, left: left}
	r := p.get()
	r.state.Store(jobRunning)
	r.work <- c
	select {
	case <-r.done:
		p.put(r)
		return c.v, c.err
	case <-ctx.Done():
	}
	if r.state.CompareAndSwap(jobRunning, jobAbandoned) {
		var zero T
		return zero, ctx.Err()
	}
	// Answered just now: the answer is the caller's after all.
	<-r.done
	p.put(r)
	return c.v, c.err
}

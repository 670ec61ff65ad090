// Package runner keeps the goroutines on which a backend makes the calls
// its callers may stop waiting for: a client call that takes no context
// (ZooKeeper's), or a write that must not be cut short when the caller's
// context ends (etcd's put of a granted key). The caller hands the call to
// a runner and waits for it as long as its context allows; the runner
// finishes a call its caller abandoned, and undoes what nobody will use.
//
// Runners are kept for the next call: a call then costs a hand-over to a
// goroutine that is already waiting, where a goroutine started per call
// begins with a small stack that then grows, by copying, to the depth of
// the client's call, which cost a lock cycle more client CPU than anything
// else of the backend's own.
package runner

import (
	"context"
	"runtime/pprof"
	"sync"
	"sync/atomic"
)

// MaxIdle bounds the runners a Pool keeps waiting: as many as it had calls
// in flight at once, up to this many.
const MaxIdle = 16

// Job is a call made on a runner.
type Job interface {
	// Run makes the call.
	Run()
	// Abandoned follows Run when the caller stopped waiting first: it
	// undoes what Run did that nobody will use.
	Abandoned()
}

// Pool is a backend's idle runners. Its zero value is ready to use. L is
// what each runner keeps for the callers it serves (a timer, say).
type Pool[L any] struct {
	mu     sync.Mutex
	idle   []*Runner[L]
	closed bool
}

// The states of a runner's job.
const (
	running   int32 = iota
	answered        // Run returned while its caller waited
	abandoned       // the caller stopped waiting first
)

// Runner is a goroutine that runs one job at a time, for the caller that
// took it from the pool, until the caller puts it back.
type Runner[L any] struct {
	// Local is kept with the runner from one caller to the next; a new
	// runner's is the zero value.
	Local L
	pool  *Pool[L]
	work  chan Job      // 1-buffered; closed to end the runner
	done  chan struct{} // 1-buffered; signalled when a job's Run returns, unless abandoned
	state atomic.Int32
}

// Get returns an idle runner, or starts one.
func (p *Pool[L]) Get() *Runner[L] {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		r := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return r
	}
	p.mu.Unlock()
	r := &Runner[L]{pool: p, work: make(chan Job, 1), done: make(chan struct{}, 1)}
	go r.loop()
	return r
}

// Put takes r back from its caller, its job answered (or none given): it
// waits for the next, or ends when MaxIdle others wait or the pool is
// closed. A runner whose job was abandoned puts itself back once the job
// is over.
func (p *Pool[L]) Put(r *Runner[L]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= MaxIdle {
		close(r.work)
		return
	}
	p.idle = append(p.idle, r)
}

// Close ends the idle runners, and every other one as it comes back.
func (p *Pool[L]) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, r := range p.idle {
		close(r.work)
	}
	p.idle = nil
}

// Idle is how many runners wait for work.
func (p *Pool[L]) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// Start gives r its caller's job.
func (r *Runner[L]) Start(j Job) {
	r.state.Store(running)
	r.work <- j
}

// Done is signalled when the job's Run returns while its caller waits.
func (r *Runner[L]) Done() <-chan struct{} { return r.done }

// Abandon tells r that its caller stops waiting. It reports false when the
// job answered just now: the answer is the caller's after all, who then
// receives from Done and puts r back.
func (r *Runner[L]) Abandon() bool {
	return r.state.CompareAndSwap(running, abandoned)
}

func (r *Runner[L]) loop() {
	// Started for one caller, it serves later ones too: the profiler
	// labels it inherited (pprof.Do) are the first caller's, and would be
	// charged with the others' work.
	pprof.SetGoroutineLabels(context.Background())
	for j := range r.work {
		j.Run()
		if r.state.CompareAndSwap(running, answered) {
			r.done <- struct{}{}
			continue
		}
		j.Abandoned()
		r.pool.Put(r)
	}
}

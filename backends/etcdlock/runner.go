package etcdlock

import (
	"context"

	"github.com/warden-go/warden/backends/internal/runner"
)

// runners finish the writes whose callers' contexts ended (see unbound).
type runners = runner.Pool[struct{}]

// unboundCall is unbound's job: f, and what to do with its answer if nobody
// waits for it any more.
type unboundCall[T any] struct {
	f    func() (T, error)
	left func(T)
	v    T
	err  error
}

func (c *unboundCall[T]) Run() { c.v, c.err = c.f() }

func (c *unboundCall[T]) Abandoned() {
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
	r := p.Get()
	r.Start(c)
	select {
	case <-r.Done():
		p.Put(r)
		return c.v, c.err
	case <-ctx.Done():
	}
	if r.Abandon() {
		var zero T
		return zero, ctx.Err()
	}
	<-r.Done()
	p.Put(r)
	return c.v, c.err
}

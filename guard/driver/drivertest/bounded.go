package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

const (
	// boundedCallBound is the ctx every call gets in testBoundedCalls.
	boundedCallBound = 300 * time.Millisecond
	// boundedCallSlack is what such a call may take past it: room for a
	// loaded machine's scheduling, far below the seconds a client that
	// waits out its own timeouts takes.
	boundedCallSlack = 250 * time.Millisecond
)

// testBoundedCalls checks the promise a Locker makes when it declares
// driver.ContextBounded (every call returns once its ctx is done) or
// driver.DeadlineBounded (once its ctx's deadline has passed), on which
// guard calls it on the caller's goroutine with nothing to end the call
// but the backend itself: against a server gone silent, every call returns
// an error within its bound, whatever the client's own timeouts. A
// ContextBounded Locker gets contexts that are cancelled, the others
// contexts that reach their deadline.
func testBoundedCalls(t *testing.T, b *Backend) {
	if b.Silence == nil {
		t.Skip("Backend.Silence is nil")
	}
	l, silence := b.Silence(t)
	cb, _ := l.(driver.ContextBounded)
	byCtx := cb != nil && cb.BoundedByContext()
	db, _ := l.(driver.DeadlineBounded)
	byDeadline := db != nil && db.BoundedByDeadline()
	if !byCtx && !byDeadline {
		t.Skip("the Locker declares no bound of its own: guard bounds its calls")
	}
	// ctxErr is what the calls' contexts end with: the error a call cut
	// short by it reports, when it does not report the server unavailable.
	ctxErr := context.DeadlineExceeded
	if byCtx {
		ctxErr = context.Canceled
	}
	bound := func() (context.Context, context.CancelFunc) {
		if byCtx {
			ctx, cancel := context.WithCancel(context.Background())
			stop := time.AfterFunc(boundedCallBound, cancel)
			return ctx, func() { stop.Stop(); cancel() }
		}
		return context.WithTimeout(context.Background(), boundedCallBound)
	}
	held, free := key(t), key(t)
	lease := mustAcquire(t, l, b.ctx(t), held, b.held(false))
	silence()

	type call struct {
		name string
		f    func(ctx context.Context) error
	}
	calls := []call{
		{"Acquire", func(ctx context.Context) error { return acquired(l.Acquire(ctx, free, b.held(false))) }},
		{"Acquire, waiting", func(ctx context.Context) error { return acquired(l.Acquire(ctx, free, b.held(true))) }},
		{"Acquire of a held key, waiting", func(ctx context.Context) error { return acquired(l.Acquire(ctx, held, b.held(true))) }},
		{"Refresh", func(ctx context.Context) error { return lease.Refresh(ctx, b.held(false).TTL) }},
		{"Release", lease.Release},
	}
	if p, ok := l.(driver.Pinger); ok {
		calls = append(calls, call{"Ping", p.Ping})
	}
	for _, c := range calls {
		ctx, cancel := bound()
		start := time.Now()
		err := c.f(ctx)
		took := time.Since(start)
		cancel()
		t.Logf("%s: %v, %v", c.name, took.Round(time.Millisecond), err)
		switch {
		case err == nil:
			t.Errorf("%s succeeded against a silent server", c.name)
		case !errors.Is(err, ctxErr) && !errors.Is(err, driver.ErrUnavailable):
			t.Errorf("%s against a silent server: %v, want %v or ErrUnavailable", c.name, err, ctxErr)
		}
		if took > boundedCallBound+boundedCallSlack {
			t.Errorf("%s took %v with a ctx done after %v", c.name, took.Round(time.Millisecond), boundedCallBound)
		}
	}
}

// acquired turns an acquisition's result into its error, releasing (in
// the background, the server being silent) a lease it should not have got.
func acquired(lease driver.Lease, err error) error {
	if err == nil {
		go lease.Release(context.Background())
	}
	return err
}

package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

const (
	// boundedCallBound is the ctx every call gets in CheckBounded.
	boundedCallBound = 300 * time.Millisecond
	// boundedCallSlack is what such a call may take past it: room for a
	// loaded machine's scheduling, far below the seconds a client that
	// waits out its own timeouts takes.
	boundedCallSlack = 250 * time.Millisecond
)

// BoundedCall is one call CheckBounded makes.
type BoundedCall struct {
	Name string
	Call func(ctx context.Context) error
}

// CheckBounded makes each call, against a server gone silent, with a ctx
// that ends after a bound: cancelled when byCtx, reaching its deadline
// otherwise. Each must return within that bound and a slack for a loaded
// machine, with ctx's error or ErrUnavailable: the promise of a backend
// that declares driver.ContextBounded (byCtx) or driver.DeadlineBounded,
// and of an idempotency store that declares their counterparts, on which
// guard and the idempotency Executor call it with nothing to end the call
// but the backend itself.
func CheckBounded(t *testing.T, byCtx bool, calls []BoundedCall) {
	t.Helper()
	ctxErr := context.DeadlineExceeded
	if byCtx {
		ctxErr = context.Canceled
	}
	bound := func() (context.Context, context.CancelFunc) {
		if !byCtx {
			return context.WithTimeout(context.Background(), boundedCallBound)
		}
		// A cancellation with no deadline at all: the client must heed
		// the cancellation itself.
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(boundedCallBound, cancel)
		return ctx, func() { stop.Stop(); cancel() }
	}
	for _, c := range calls {
		ctx, cancel := bound()
		start := time.Now()
		err := c.Call(ctx)
		took := time.Since(start)
		cancel()
		t.Logf("%s: %v, %v", c.Name, took.Round(time.Millisecond), err)
		switch {
		case err == nil:
			t.Errorf("%s succeeded against a silent server", c.Name)
		case !errors.Is(err, ctxErr) && !errors.Is(err, driver.ErrUnavailable):
			t.Errorf("%s against a silent server: %v, want %v or ErrUnavailable", c.Name, err, ctxErr)
		}
		if took > boundedCallBound+boundedCallSlack {
			t.Errorf("%s took %v with a ctx done after %v", c.Name, took.Round(time.Millisecond), boundedCallBound)
		}
	}
}

// testBoundedCalls checks, given Backend.Silence, the bound a Locker that
// declares driver.ContextBounded or driver.DeadlineBounded promises (see
// CheckBounded).
func testBoundedCalls(t *testing.T, b *Backend) {
	if b.Silence == nil {
		t.Skip("Backend.Silence is nil")
	}
	l, silence := b.Silence(t)
	cb, _ := l.(driver.ContextBounded)
	byCtx := cb != nil && cb.BoundedByContext()
	db, _ := l.(driver.DeadlineBounded)
	if !byCtx && (db == nil || !db.BoundedByDeadline()) {
		t.Skip("the Locker declares no bound of its own: guard bounds its calls")
	}
	held, free := key(t), key(t)
	lease := mustAcquire(t, l, b.ctx(t), held, b.held(false))
	silence()
	calls := []BoundedCall{
		{"Acquire", func(ctx context.Context) error { return acquired(l.Acquire(ctx, free, b.held(false))) }},
		{"Acquire, waiting", func(ctx context.Context) error { return acquired(l.Acquire(ctx, free, b.held(true))) }},
		{"Acquire of a held key, waiting", func(ctx context.Context) error { return acquired(l.Acquire(ctx, held, b.held(true))) }},
		{"Refresh", func(ctx context.Context) error { return lease.Refresh(ctx, b.held(false).TTL) }},
		{"Release", lease.Release},
	}
	if p, ok := l.(driver.Pinger); ok {
		calls = append(calls, BoundedCall{"Ping", p.Ping})
	}
	CheckBounded(t, byCtx, calls)
}

// acquired turns an acquisition's result into its error, releasing (in
// the background, the server being silent) a lease it should not have got.
func acquired(lease driver.Lease, err error) error {
	if err == nil {
		go lease.Release(context.Background())
	}
	return err
}

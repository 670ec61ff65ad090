package etcdlock

import (
	"context"
	"fmt"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// DefaultRequestTimeout bounds every request to etcd unless
// WithRequestTimeout says otherwise. The etcd client waits for a connection
// without limit, and retries a lease grant without limit, so without a bound
// of its own a call on an unreachable cluster lasts as long as the caller's
// context, forever for context.Background().
const DefaultRequestTimeout = 5 * time.Second

// Option configures a Locker.
type Option func(*config) error

type config struct {
	timeout bound
}

// WithRequestTimeout bounds each request the Locker makes to etcd (a lease
// grant, a transaction, a read, a revocation). A request that gets no answer
// in time fails with an error wrapping driver.ErrUnavailable; a waiting
// acquisition then tries again until its context is done. d must be
// positive. Default DefaultRequestTimeout.
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: etcd request timeout %v is not positive", driver.ErrInvalidOption, d)
		}
		c.timeout = bound(d)
		return nil
	}
}

// bound is the longest a single request may wait for its answer.
type bound time.Duration

// ctx derives the context of one request from the caller's.
func (b bound) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, time.Duration(b))
}

// detached is the context of a write that must not be abandoned half way
// because the caller gave up: parent's values without its cancellation.
func (b bound) detached(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(parent), time.Duration(b))
}

// err reports the failure err of a request made on rctx for a caller whose
// context is ctx. The caller's own cancellation or deadline stays a context
// error. The bound running out is reported as the cluster being unavailable,
// without wrapping context.DeadlineExceeded, so that nobody mistakes it for
// the caller's deadline.
func (b bound) err(ctx, rctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	// The server gives up at the deadline the request carried, and its
	// answer can arrive before ctx's own timer has fired on a busy machine.
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	if ctx.Err() == nil && rctx.Err() != nil {
		return fmt.Errorf("%w: etcd: no answer within %v", driver.ErrUnavailable, time.Duration(b))
	}
	return driver.Unavailable(ctx, fmt.Errorf("etcd: %w", err))
}

// parent is what a request made for a caller whose context is ctx derives
// from: ctx, or, when detached, ctx's values without its cancellation.
func (b bound) parent(ctx context.Context, detached bool) context.Context {
	if detached && ctx.Done() != nil {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// report is err for a request that members sent: cut says why it was cut
// short, if it was (errNoAnswer at the bound, errAvoided when its member
// stopped answering). A request cut short because its member stopped
// answering wraps errAvoided as well as driver.ErrUnavailable.
func (b bound) report(ctx context.Context, cut, err error) error {
	if err == nil {
		return nil
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	if ctx.Err() == nil {
		switch cut {
		case errNoAnswer:
			return fmt.Errorf("%w: etcd: no answer within %v", driver.ErrUnavailable, time.Duration(b))
		case errAvoided:
			return fmt.Errorf("%w: %w", driver.ErrUnavailable, errAvoided)
		}
	}
	return driver.Unavailable(ctx, fmt.Errorf("etcd: %w", err))
}

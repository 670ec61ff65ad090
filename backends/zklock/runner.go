package zklock

import (
	"context"
	"fmt"
	"time"

	"github.com/warden-go/warden/backends/internal/runner"
)

// The client library's calls take no context: each blocks until the server
// answers or the connection is lost. So that a caller can return when its
// ctx ends or the request timeout passes, the call is made on a runner (see
// package runner), which finishes it without the caller if need be. Each
// runner keeps its timer for the next request, which then costs no new
// timer either.

// runners make the requests of calls, each keeping its timer.
type runners = runner.Pool[*time.Timer]

// request is a call to make on a runner: Run makes it, and Abandoned
// follows Run when the caller has stopped waiting, to undo what Run made
// that nobody will use.
type request = runner.Job

// stopTimer stops t and drains a tick that was already sent (with the
// asynchronous timer channels of a main module older than Go 1.23), so
// that the runner's next caller does not read it as its own timeout.
func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
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
	r := l.runners.Get()
	limit := l.requestLimit()
	if r.Local == nil {
		r.Local = time.NewTimer(limit)
	} else {
		r.Local.Reset(limit)
	}
	timer := r.Local
	if err := l.linked(ctx, op, timer.C); err != nil {
		stopTimer(timer)
		l.runners.Put(r)
		return err
	}
	r.Start(req)
	var cut error
	select {
	case <-r.Done():
		stopTimer(timer)
		l.runners.Put(r)
		return nil
	case <-timer.C:
		cut = unavailable(op, fmt.Errorf("no answer within %v", limit))
	case <-ctx.Done():
		stopTimer(timer)
		cut = ctx.Err()
	case <-l.creds.refused:
		// A request still queued would wait for a connection that the
		// Locker no longer makes.
		stopTimer(timer)
		cut = l.creds.err
	}
	if r.Abandon() {
		return cut
	}
	// Answered just now: the answer is the caller's after all.
	<-r.Done()
	l.runners.Put(r)
	return nil
}

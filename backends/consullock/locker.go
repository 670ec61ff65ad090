package consullock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// The session TTLs a Consul server accepts: below MinTTL it refuses to
// create the session (its session_ttl_min, 10 s by default), above MaxTTL
// always.
const (
	MinTTL = 10 * time.Second
	MaxTTL = 24 * time.Hour
)

// DefaultRequestTimeout bounds every request to Consul unless
// WithRequestTimeout says otherwise. The client's default HTTP transport has
// no timeout of its own, so without a bound a request to an agent that
// stopped answering lasts as long as the caller's context.
const DefaultRequestTimeout = 5 * time.Second

// Locker is a driver.Locker on Consul. It also reports holders
// (driver.Inspector, driver.Lister), removes them for operators
// (driver.ForceReleaser), answers health checks (driver.Pinger) and declares
// the TTLs Consul accepts (driver.Limiter). It is safe for concurrent use;
// Close it when done.
type Locker struct {
	client  *api.Client
	timeout time.Duration
	// seq tells apart the queue keys of several acquisitions under one
	// session.
	seq atomic.Uint64

	mu       sync.Mutex
	sessions map[time.Duration]*session
	// retired are sessions replaced after they were lost or given up,
	// whose renewal may still be destroying them: Close waits for them.
	retired []*session
	// starting has a channel per TTL whose session is being created,
	// closed when the creation is over.
	starting map[time.Duration]chan struct{}
	closed   bool
	// quit is closed by Close: lost sessions stop retrying their
	// destruction then.
	quit chan struct{}
	// anchorOptional marks a Store's Locker, whose sessions hold no
	// locks: one whose anchor is refused for want of rights lives on
	// unanchored (see newSession), and one whose markers Consul hides is
	// kept (see watchRevocations).
	anchorOptional bool
	// token is the token the reads that decide carry, as Consul last
	// named it (see readToken); zero before.
	token readToken
}

var (
	_ driver.Locker  = (*Locker)(nil)
	_ driver.Limiter = (*Locker)(nil)
)

// Option configures a Locker.
type Option func(*Locker) error

// WithRequestTimeout bounds each request the Locker makes to Consul (a
// session's creation or renewal, a transaction, a read). A request that gets
// no answer in time fails with an error wrapping driver.ErrUnavailable; a
// waiting acquisition then tries again until its context is done. Blocking
// queries, which wait on purpose, are bounded by their wait time instead
// (see the package documentation). d must be positive. Default
// DefaultRequestTimeout.
func WithRequestTimeout(d time.Duration) Option {
	return func(l *Locker) error {
		if d <= 0 {
			return fmt.Errorf("%w: consul request timeout %v is not positive", driver.ErrInvalidOption, d)
		}
		l.timeout = d
		return nil
	}
}

// New returns a Locker that keeps its locks in the Consul datacenter client
// talks to. The client stays the caller's. No request is made until the
// first acquisition, which creates the session.
func New(client *api.Client, opts ...Option) (*Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil consul client", driver.ErrInvalidOption)
	}
	l := &Locker{
		client:   client,
		timeout:  DefaultRequestTimeout,
		sessions: make(map[time.Duration]*session),
		starting: make(map[time.Duration]chan struct{}),
		quit:     make(chan struct{}),
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", driver.ErrInvalidOption)
		}
		if err := o(l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Limits implements driver.Limiter: a Consul session's TTL is between MinTTL
// and MaxTTL. guard rejects any other TTL when it is configured, so a Guard
// on Consul needs guard.WithTTL of at least 10 s: a holder that crashes
// keeps its locks for that long at least (up to twice as long, see the
// package documentation).
func (l *Locker) Limits() driver.Limits {
	return driver.Limits{MinTTL: MinTTL, MaxTTL: MaxTTL}
}

// Close destroys the Locker's sessions, which deletes every lock they hold
// (their Done channels close before the destruction is sent), and makes
// later acquisitions fail with an error wrapping driver.ErrUnavailable.
// Each destruction is bounded by the request timeout.
func (l *Locker) Close() error {
	l.mu.Lock()
	if !l.closed {
		close(l.quit)
	}
	l.closed = true
	sessions, retired := l.sessions, l.retired
	l.sessions, l.retired = nil, nil
	l.mu.Unlock()
	var errs []error
	for _, s := range sessions {
		errs = append(errs, s.close(true))
	}
	for _, s := range retired {
		s.close(false)
	}
	return errors.Join(errs...)
}

// errClosed is what an acquisition on a closed Locker returns.
var errClosed = fmt.Errorf("%w: consul locker closed", driver.ErrUnavailable)

// session returns the live session for ttl, creating one if there is none
// or the last one was lost or given up.
func (l *Locker) session(ctx context.Context, ttl time.Duration) (*session, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, errClosed
		}
		if s := l.sessions[ttl]; s != nil && !s.lost() {
			l.mu.Unlock()
			return s, nil
		}
		// Concurrent first acquisitions share the session one of them
		// creates, waiting for it no longer than their own ctx.
		if starting := l.starting[ttl]; starting != nil {
			l.mu.Unlock()
			select {
			case <-starting:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		starting := make(chan struct{})
		l.starting[ttl] = starting
		l.mu.Unlock()

		s, err := newSession(ctx, l, ttl)

		l.mu.Lock()
		delete(l.starting, ttl)
		close(starting)
		if err != nil {
			l.mu.Unlock()
			return nil, err
		}
		if l.closed {
			l.mu.Unlock()
			s.close(true)
			return nil, errClosed
		}
		if old := l.sessions[ttl]; old != nil {
			l.retired = slices.DeleteFunc(l.retired, (*session).exitedYet)
			l.retired = append(l.retired, old)
		}
		l.sessions[ttl] = s
		l.mu.Unlock()
		return s, nil
	}
}

// LockKey returns the Consul KV key of the lock named key (key as the
// backend sees it, with guard's prefix): the key exists, acquired by its
// holder's session, exactly while the lock is held. Waiters queue
// under LockKey(key)+"/". Path-escaping the name keeps lock "a" from
// containing the keys of lock "a/b"; the ".lock" suffix keeps locks apart
// from other keys under the same prefix.
func LockKey(key string) string {
	return url.PathEscape(key) + ".lock"
}

// maxEscaped bounds the escape of a name (url.PathEscape), with which
// every key of the name starts: Consul refuses a transaction's body over
// limits.txn_max_req_len (512 KiB by default), and a forced release names
// up to 42 holdings' keys, thrice each, in one. Any name guard makes (a
// key of 200 bytes after a prefix of as many) fits.
const maxEscaped = 2048

// checkName refuses, with driver.ErrInvalidKey, a name whose keys would be
// too long for Consul to take.
func checkName(key string) error {
	if n := len(url.PathEscape(key)); n > maxEscaped {
		return fmt.Errorf("%w: %d bytes once escaped for a consul key, more than %d", driver.ErrInvalidKey, n, maxEscaped)
	}
	return nil
}

// queueDir is the directory of the lock's waiters.
func queueDir(lockKey string) string { return lockKey + "/" }

// queueName is the last path element of a waiter's queue key: its
// session and a sequence number.
func (l *Locker) queueName(s *session) string {
	return s.id + "-" + strconv.FormatUint(l.seq.Add(1), 16)
}

// rctx derives the context of one request from the caller's.
func (l *Locker) rctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.timeout)
}

// detached is the context of a write that must not be abandoned half way
// because the caller gave up: ctx's values without its cancellation.
func (l *Locker) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
}

// fail reports the failure err of a request made on rctx for a caller whose
// context is ctx: the caller's own cancellation or deadline stays a context
// error; the request's bound running out, or any other failure, wraps
// driver.ErrUnavailable.
func (l *Locker) fail(ctx, rctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	if ctx.Err() == nil && rctx.Err() != nil {
		return fmt.Errorf("%w: consul: no answer within %v", driver.ErrUnavailable, l.timeout)
	}
	if ctx.Err() == nil {
		if err := refusal(err); err != nil {
			return err
		}
	}
	return driver.Unavailable(ctx, fmt.Errorf("consul: %w", err))
}

// errRefused: Consul answered a request with a refusal that the same
// request would get again (a 4xx status but 408 and 429): a namespace on
// a Consul without them, a body over its txn_max_req_len, or a token
// without the rights (errDenied). An acquisition returns it at once, where
// it tries again after other failures, and a read sent until answered
// takes it as the answer: sending again would be refused again, and a
// refusal must not read as a lock held by someone else.
var errRefused = fmt.Errorf("%w: consul refused the request", driver.ErrUnavailable)

// errDenied: Consul refused a request for want of ACL rights (or knows no
// such token).
var errDenied = fmt.Errorf("%w for want of ACL rights", errRefused)

// refusal returns err, the failure of a request, as errRefused (errDenied
// for a 403) with Consul's reason when Consul refused the request for
// good, nil otherwise.
func refusal(err error) error {
	se := api.StatusError{}
	switch {
	case errors.Is(err, errRefused):
		return err
	case !errors.As(err, &se) || se.Code < 400 || se.Code > 499 ||
		se.Code == http.StatusRequestTimeout || se.Code == http.StatusTooManyRequests:
		return nil
	case se.Code == http.StatusForbidden:
		return fmt.Errorf("%w: %s", errDenied, se.Body)
	}
	return fmt.Errorf("%w: %d %s", errRefused, se.Code, se.Body)
}

// notSentOr is err, the failure of a write (a forced release's
// transaction, an idempotency record's delete), marked driver.NotSent when
// it proves that the write changed nothing: no connection could be made
// for it (net/http's dial error: the client sends a request again only
// when it wrote none of it, and the write is sent once), or Consul refused
// it (errRefused: a 4xx answer, a transaction refused whole).
func notSentOr(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || errors.Is(err, errRefused) {
		return driver.NotSent(err)
	}
	return err
}

// denied returns errDenied with Consul's reason when the refused
// transaction resp failed an ACL check, nil otherwise. Consul reports such
// a failure as "Permission denied" first, which is how its own code tells
// them (other failures name their key, which may hold those words).
func denied(resp *api.KVTxnResponse) error {
	for _, e := range resp.Errors {
		if strings.HasPrefix(e.What, "Permission denied") {
			return fmt.Errorf("%w: %s", errDenied, e.What)
		}
	}
	return nil
}

// writeOpts and queryOpts carry ctx to the client.
func writeOpts(ctx context.Context) *api.WriteOptions { return (&api.WriteOptions{}).WithContext(ctx) }

func queryOpts(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx)
}

package etcd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard"
)

// MinTTL is the shortest lock TTL the backend accepts. etcd refuses to let a
// lease expire sooner than about 1.5 election timeouts (1.5 s with the default
// 1 s election timeout) and counts in whole seconds.
const MinTTL = 2 * time.Second

// Locker is a guard.Locker on etcd. It also offers read/write locks
// (guard.RWLocker), semaphores (guard.Semaphorer) and batched refresh
// (guard.BatchRefresher). It is safe for concurrent use; Close it when done.
type Locker struct {
	client *clientv3.Client
	prefix string
	// seq tells apart the keys of several acquisitions of one name under one
	// session, so that each contender, even in one process, has its own key.
	seq atomic.Uint64

	mu       sync.Mutex
	sessions map[time.Duration]*session
	closed   bool
}

var (
	_ guard.Locker         = (*Locker)(nil)
	_ guard.RWLocker       = (*Locker)(nil)
	_ guard.Semaphorer     = (*Locker)(nil)
	_ guard.BatchRefresher = (*Locker)(nil)
)

// New returns a Locker that keeps its locks in the etcd cluster client talks
// to. The client stays the caller's: Close does not close it. No request is
// made until the first acquisition, which starts the session.
func New(client *clientv3.Client, opts ...Option) (*Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil etcd client", guard.ErrInvalidOption)
	}
	c := config{prefix: DefaultKeyPrefix}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return &Locker{client: client, prefix: c.prefix, sessions: make(map[time.Duration]*session)}, nil
}

// Acquire takes the exclusive lock key. See the package documentation for the
// TTL rules: opts.TTL is the session's lease TTL, whole seconds, at least
// MinTTL.
func (l *Locker) Acquire(ctx context.Context, key string, opts guard.AcquireOptions) (guard.Lease, error) {
	return l.acquire(ctx, key, opts, exclusive, 0)
}

// Close revokes the Locker's sessions, which releases every lock it holds
// (their Done channels close), and makes later acquisitions fail.
func (l *Locker) Close(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	sessions := l.sessions
	l.sessions = nil
	l.mu.Unlock()
	var errs []error
	for _, s := range sessions {
		errs = append(errs, s.close(ctx, true))
	}
	return errors.Join(errs...)
}

// checkTTL reports why ttl cannot be an etcd lease TTL.
func checkTTL(ttl time.Duration) error {
	switch {
	case ttl < MinTTL:
		return fmt.Errorf("%w: etcd TTL %v is shorter than the minimum %v", guard.ErrInvalidOption, ttl, MinTTL)
	case ttl%time.Second != 0:
		return fmt.Errorf("%w: etcd TTL %v is not a whole number of seconds", guard.ErrInvalidOption, ttl)
	}
	return nil
}

// session returns the live session for ttl, starting one if there is none or
// the last one was lost.
func (l *Locker) session(ctx context.Context, ttl time.Duration) (*session, error) {
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	// Holding mu across the grant makes concurrent first acquisitions share
	// one session instead of racing to create several.
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("%w: etcd locker closed", guard.ErrUnavailable)
	}
	if s := l.sessions[ttl]; s != nil && !s.lost() {
		return s, nil
	}
	s, err := newSession(ctx, l.client, ttl)
	if err != nil {
		return nil, err
	}
	l.sessions[ttl] = s
	return s, nil
}

// dir is the directory of the keys of the lock named key. Path-escaping the
// name keeps lock "a" from containing the keys of lock "a/b".
func (l *Locker) dir(key string) string {
	return l.prefix + "/" + url.PathEscape(key) + "/"
}

// contenderName is the last path element of a contender's key: the session's
// lease id and a sequence number, in hex digits and '-' only, so that writer
// keys sort before the readers' "r/" subdirectory.
func (l *Locker) contenderName(s *session) string {
	return strconv.FormatInt(int64(s.id), 16) + "-" + strconv.FormatUint(l.seq.Add(1), 16)
}

// unavailable wraps an etcd failure, unless it is ctx's own cancellation,
// which stays a context error.
func unavailable(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	// The server gives up at the deadline the request carried, and its answer
	// can arrive before ctx's own timer has run on a busy machine.
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return fmt.Errorf("%w: etcd: %w", guard.ErrUnavailable, err)
}

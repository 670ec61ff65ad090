package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

// MinTTL is the shortest lock TTL the backend accepts. etcd refuses to let a
// lease expire sooner than about 1.5 election timeouts (1.5 s with the default
// 1 s election timeout) and counts in whole seconds.
const MinTTL = 2 * time.Second

// MaxTTL is the longest TTL etcd grants a lease (its MaxLeaseTTL, about
// 285 years).
const MaxTTL = 9_000_000_000 * time.Second

// Locker is a driver.Locker on etcd. It also offers read/write locks
// (driver.RWLocker), semaphores (driver.Semaphorer) and declares its TTL
// limits (driver.Limiter). It is safe for concurrent use; Close it when done.
type Locker struct {
	client *clientv3.Client
	// members pins the member every request goes to.
	members *members
	timeout bound
	// seq tells apart the keys of several contenders for one name under one
	// session, so that each contender, even in one process, has its own key.
	seq atomic.Uint64
	// runners finish the writes whose callers' contexts ended (see
	// unbound).
	runners runners

	mu       sync.Mutex
	sessions map[time.Duration]*session
	// retired are sessions replaced after they were lost or given up, whose
	// keepalive may still be revoking: Close waits for them.
	retired []*session
	// starting has a channel per TTL whose session is being granted,
	// closed when the grant is over.
	starting map[time.Duration]chan struct{}
	closed   bool
	// quit is closed by Close: lost sessions stop retrying their
	// revocation then.
	quit chan struct{}
}

var (
	_ driver.Locker         = (*Locker)(nil)
	_ driver.RWLocker       = (*Locker)(nil)
	_ driver.Semaphorer     = (*Locker)(nil)
	_ driver.Limiter        = (*Locker)(nil)
	_ driver.ContextBounded = (*Locker)(nil)
)

// New returns a Locker that keeps its locks in the etcd cluster client talks
// to. The client stays the caller's: Close does not close it. No request is
// made until the first acquisition, which starts the session.
//
// The Locker dials the client's endpoints itself (client.Dial, with the
// client's credentials and dial options), one at a time, so that it can stop
// sending to a member that does not answer (see the package documentation);
// those connections close with the Locker or the client. Closing the
// client ends the Locker's sessions at once (their Done channels close,
// and nothing is sent any more), as a crash of the process would. A
// client whose KV or Watcher was replaced (namespace.NewKV) is used as it
// is instead, with the client's own balancing, so that the replacement
// still applies.
func New(client *clientv3.Client, opts ...Option) (*Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil etcd client", driver.ErrInvalidOption)
	}
	c := config{timeout: bound(DefaultRequestTimeout)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", driver.ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return &Locker{
		client:   client,
		members:  newMembers(client),
		timeout:  c.timeout,
		sessions: make(map[time.Duration]*session),
		starting: make(map[time.Duration]chan struct{}),
		quit:     make(chan struct{}),
	}, nil
}

// Limits implements driver.Limiter: etcd leases count whole seconds, and
// cannot be kept alive reliably below MinTTL. A TTL that were silently
// rounded would delay the takeover after a crash. etcd grants none above
// MaxTTL.
func (l *Locker) Limits() driver.Limits {
	return driver.Limits{MinTTL: MinTTL, MaxTTL: MaxTTL, TTLStep: time.Second}
}

// BoundedByContext implements driver.ContextBounded: every call of the
// Locker and of its leases returns once its ctx is done, so guard calls
// them on the caller's goroutine instead of one of its own. The writes that
// must not be abandoned half way (the put of a contender's key, and its
// removal when the acquisition gives up) go on in the background then.
func (l *Locker) BoundedByContext() bool { return true }

// Acquire implements driver.Locker. opts.TTL is the TTL of the session the
// key is attached to.
func (l *Locker) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, opts, exclusive, 0)
}

// Close revokes the Locker's sessions, which releases every lock it holds
// (their sessions' Done channels close before the revocation is sent), and
// makes later acquisitions fail with an error wrapping
// driver.ErrUnavailable. Each revocation is bounded by the request timeout.
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
	l.members.close()
	l.runners.Close()
	return errors.Join(errs...)
}

// errClosed is what an acquisition on a closed Locker returns.
var errClosed = fmt.Errorf("%w: etcd locker closed", driver.ErrUnavailable)

// session returns the live session for ttl, starting one if there is none or
// the last one was lost or given up.
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
		// starts instead of each granting a lease of its own; they wait for
		// it no longer than their own ctx, and try themselves if it fails.
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
			// Lost or given up: its keepalive has stopped or is stopping
			// (and may be revoking); Close waits for it.
			l.retired = slices.DeleteFunc(l.retired, (*session).exitedYet)
			l.retired = append(l.retired, old)
		}
		l.sessions[ttl] = s
		l.mu.Unlock()
		return s, nil
	}
}

// KeyDir returns the etcd key directory under which the contender keys of
// the lock named key live (key as the backend sees it, with guard's prefix),
// for tools that list a lock's holders and waiters. Path-escaping the name
// keeps lock "a" from containing the keys of lock "a/b"; the ".lock" suffix
// keeps every lock's directory apart from the idempotency store's records
// under "<store prefix>/idem/".
func KeyDir(key string) string {
	return url.PathEscape(key) + lockDir
}

// lockDir ends a lock's directory (KeyDir), and readerDir the name of its
// readers' subdirectory in it.
const (
	lockDir   = ".lock/"
	readerDir = "r/"
)

// contenderKey is a contender's key under dir: see appendContenderName.
func contenderKey(dir string, id clientv3.LeaseID, seq uint64) string {
	var buf [contenderNameLen]byte
	return dir + string(appendContenderName(buf[:0], id, seq)) // one allocation: the conversion is only read
}

// contenderNameLen is the longest contender name.
const contenderNameLen = 2*16 + 2

// appendContenderName appends the last path element of a contender's key:
// the session's lease id and a sequence number of the Locker, in hex digits
// and '-' only, so that writer keys sort before the readers' subdirectory
// (readerDir).
func appendContenderName(b []byte, id clientv3.LeaseID, seq uint64) []byte {
	b = strconv.AppendInt(b, int64(id), 16)
	b = append(b, '-')
	return strconv.AppendUint(b, seq, 16)
}

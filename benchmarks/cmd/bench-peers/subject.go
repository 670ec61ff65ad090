package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// subject is one lock implementation under measurement: warden's Guard on a
// backend, or a peer library used the way its documentation shows.
type subject struct {
	id     string
	label  string // as the report names it
	group  string
	warden bool
	// how is how the subject is set up and waits, for the report.
	how string
	// fixture sets up one measurement. Workers made from it have clients of
	// their own, as separate processes would, except in-process subjects,
	// whose workers share one lock table as goroutines of a process do.
	fixture func(ctx context.Context, m *meter) (fixture, error)
	// holder sets up the renewal scenario; nil when it is not measured.
	holder func(ctx context.Context, m *meter, ttl time.Duration) (holder, error)
	// maxLocks bounds the renewal scenario's sizes for this subject; 0:
	// every size.
	maxLocks int
	// quietAfter is how long the subject's acquisitions may still send
	// requests of their own after the last lock is taken: the renewal
	// scenario's window starts no sooner, so that it counts renewals alone.
	quietAfter time.Duration
	// minTTL is the shortest lease TTL the subject's server accepts
	// (Consul's sessions: 10s); the renewal scenario uses it when -ttl is
	// shorter.
	minTTL time.Duration
	// redis lists the Redis servers whose commands the subject's figures
	// count; none for the other backends.
	redis []string
	// batch is how many cycles one latency sample times: in-process locks
	// take less time than reading the clock does.
	batch int
	// peer names the peer a tuned variant is of ("" for warden and for a
	// peer at its documented settings).
	tunedOf string
}

// fixture makes the workers of one measurement.
type fixture interface {
	worker(ctx context.Context) (worker, error)
	close()
}

// worker takes a lock the blocking way, runs a section and releases it.
type worker interface {
	// cycle waits for key, runs section while holding it, and releases it
	// whether or not ctx is done by then, as a deferred unlock would.
	cycle(ctx context.Context, key string, section func()) error
	close()
}

// holder keeps many locks alive at once, renewing them the way the
// subject's users have to (for peers without a keeper, a goroutine per
// lock).
type holder interface {
	// hold acquires every key and keeps renewing them until release.
	hold(ctx context.Context, keys []string) error
	// release releases every lock. A lock found no longer held then
	// counts as lost, not as a failure: it ran out before its release.
	release(ctx context.Context) error
	// lost counts, after release, each lock lost while held or found
	// expired by its release, once.
	lost() int
	close()
}

// perWorker is the fixture of subjects whose workers share nothing.
type perWorker func(ctx context.Context) (worker, error)

func (f perWorker) worker(ctx context.Context) (worker, error) { return f(ctx) }
func (perWorker) close()                                       {}

// releaseContext bounds a release that must happen even after the caller's
// context is done, like warden's own release on the way out of Do.
func releaseContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

// closers runs cleanups in reverse order, like defers.
type closers []func()

func (c *closers) add(f func()) { *c = append(*c, f) }

func (c closers) close() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// parallel runs f for each index with up to width goroutines and returns
// the first error.
func parallel(ctx context.Context, n, width int, f func(ctx context.Context, i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range min(width, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// renewers is the renewal loop of a peer without a keeper: one goroutine
// per held lock, renewing it every period, as those libraries' users write
// it.
type renewers struct {
	wg    sync.WaitGroup
	stop  chan struct{}
	state []atomic.Int32 // by lock: held, releasing or lost
}

// A lock's state in renewers.
const (
	held int32 = iota
	releasing
	lost
)

func newRenewers() *renewers { return &renewers{stop: make(chan struct{})} }

// track makes room for n locks' states, before the first start.
func (r *renewers) track(n int) { r.state = make([]atomic.Int32, n) }

// lose marks lock i lost, unless it is being released: a renewal that
// finds the lock gone then is no loss, its release tells.
func (r *renewers) lose(i int) { r.state[i].CompareAndSwap(held, lost) }

// releasing marks lock i as being released, before its release is sent,
// and reports whether it had been lost already.
func (r *renewers) releasing(i int) (wasLost bool) {
	if r.state[i].CompareAndSwap(held, releasing) {
		return false
	}
	return r.state[i].Load() == lost
}

// released records what lock i's release found: held or not.
func (r *renewers) released(i int, wasHeld bool) {
	if !wasHeld {
		r.state[i].Store(lost)
	}
}

// lost counts the locks lost while held or found expired by their release.
func (r *renewers) lost() int {
	n := 0
	for i := range r.state {
		if r.state[i].Load() == lost {
			n++
		}
	}
	return n
}

// start renews one lock of ttl every period with refresh until stopped.
// The lock counts as lost, and its loop ends, when refresh says it is no
// longer held (errNotHeld), or when no renewal has been answered for a
// whole TTL since the last answered one was sent, by when the server has
// let it go. Any other failure (a renewal that waited a period for a
// connection, say) is tried again at the next period, as a user's loop
// would while the lock may still be held: such a failure is no loss.
func (r *renewers) start(i int, period, ttl time.Duration, refresh func(ctx context.Context) error) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		last := time.Now() // when the last answered renewal (or the acquisition) was sent, at the latest
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
			if r.state[i].Load() != held {
				return
			}
			sent := time.Now()
			if sent.Sub(last) >= ttl {
				r.lose(i)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), period)
			err := refresh(ctx)
			cancel()
			switch {
			case err == nil:
				last = sent
			case errors.Is(err, errNotHeld):
				r.lose(i)
				return
			}
		}
	}()
}

// halt stops every renewal. A holder releases its locks first
// (releasing): each lock's renewal goes on until the lock is released, as
// a user's does who stops one lock's renewal as it releases it. Stopping
// them all before releasing any would leave the last of 100,000 locks,
// released at the end of a queue of releases longer than their TTL, to run
// out before their turn, which is no fault of the peer. A renewal that
// meets its lock's release is not counted (see lose): the release says
// whether the lock was still held.
func (r *renewers) halt() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.wg.Wait()
}

// backoff is the wait of the hand-written peers: a jittered pause that
// starts at 1ms and doubles up to 32ms, the usual shape of a polling loop;
// linear, the tuned variant, pauses 1ms every time, as a user who wants the
// lock back at once would write it.
type backoff struct {
	next   time.Duration
	linear bool
}

func (b *backoff) wait(ctx context.Context) error {
	if b.next == 0 {
		b.next = time.Millisecond
	}
	d := b.next
	if !b.linear {
		d = b.next/2 + rand.N(b.next/2+1)
		b.next = min(2*b.next, 32*time.Millisecond)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

var errNotHeld = errors.New("lock no longer held")

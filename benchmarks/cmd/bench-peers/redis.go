package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	bsmlock "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/backends/redlock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// workerTTL is the lease TTL of the cycle scenarios: long enough that no
// lease runs out during a measurement, so the lease keeper has nothing to
// renew and the cycle alone is measured.
const workerTTL = 10 * time.Second

// newRedisClient is one worker's own client, counted into m.
func newRedisClient(addr string, m *meter) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{
		Addr: addr,
		// RedLock bounds each node's answer by the context's deadline.
		ContextTimeoutEnabled: true,
		PoolSize:              16,
	})
	c.AddHook(redisHook{m})
	return c
}

func randomOwner() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func redisSubjects(b *bench) []*subject {
	one := []string{b.srv.redis}
	nodes := b.srv.redlock
	return []*subject{
		{
			id: "warden-redis", label: "warden redislock", group: "redis", warden: true, redis: one,
			how: "guard.Do over redislock.New(go-redis client); with ContextTimeoutEnabled the Locker is driver.DeadlineBounded, so guard makes releases on the worker's goroutine, and an acquisition under the worker's cancellable context starts there too with one attempt that does not wait (bounded by 10ms), handed to a call goroutine to wait only when that attempt finds the lock held; a waiter sleeps until a release is published (Pub/Sub) or the holder's TTL ends; the lease keeper renews held locks in one pipeline per period",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) { return newWardenRedis(b.srv.redis, m) }), nil
			},
			// An acquisition whose attempt went unanswered in time (one
			// queued behind a renewal pipeline on the one-threaded
			// server) leaves a cleanup that runs again up to 5.25s after
			// it (backends/redislock/README.md): an acquisition's cost,
			// not the renewal's.
			quietAfter: 6 * time.Second,
			holder: func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
				w, err := newWardenRedis(b.srv.redis, m, guard.WithTTL(ttl))
				if err != nil {
					return nil, err
				}
				return newGuardHolder(ctx, w, b.keyFor("warm-up", "holder", 0, 0, 0))
			},
		},
		{
			id: "warden-redis-fair", label: "warden redislock, Fair()", group: "redis", warden: true, redis: one,
			how: "as warden redislock, with guard.Fair(): first come, first served through a queue in Redis",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) {
					w, err := newWardenRedis(b.srv.redis, m)
					if err == nil {
						w.opts = []guard.LockOption{guard.Fair()}
					}
					return w, err
				}), nil
			},
		},
		bsmSubject(b, false), bsmSubject(b, true),
		redsyncSubject(b, "redsync", one, false), redsyncSubject(b, "redsync", one, true),
		rawRedisSubject(b, false), rawRedisSubject(b, true),
		{
			id: "warden-redlock", label: fmt.Sprintf("warden redlock (%d nodes)", len(nodes)), group: "redlock", warden: true, redis: nodes,
			how: "guard.Do over redlock.New(a go-redis client per node), called on the worker's goroutine (driver.ContextBounded: each node's request runs on a goroutine of redlock's own); waits with jittered backoff from 2ms, bounded by the holder's TTL",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) { return newWardenRedlock(nodes, m) }), nil
			},
		},
		redsyncSubject(b, "redsync5", nodes, false), redsyncSubject(b, "redsync5", nodes, true),
	}
}

// tunedID is the id of a peer's tuned variant.
func tunedID(peer string) string { return peer + "-tuned" }

// variant fills in what tells a peer's tuned variant from the peer at its
// documented settings.
func variant(s *subject, tuned bool, documented, fast string) *subject {
	if tuned {
		s.tunedOf = s.id
		s.id = tunedID(s.id)
		s.label += ", tuned"
		s.how = fast
	} else {
		s.how = documented
	}
	return s
}

func bsmSubject(b *bench, tuned bool) *subject {
	retry := func() bsmlock.RetryStrategy {
		return bsmlock.ExponentialBackoff(16*time.Millisecond, 256*time.Millisecond)
	}
	if tuned {
		retry = func() bsmlock.RetryStrategy { return bsmlock.LinearBackoff(time.Millisecond) }
	}
	s := &subject{
		id: "bsm", label: "bsm/redislock " + modVersion("github.com/bsm/redislock"), group: "redis", redis: []string{b.srv.redis},
		fixture: func(ctx context.Context, m *meter) (fixture, error) {
			return perWorker(func(ctx context.Context) (worker, error) {
				c := newRedisClient(b.srv.redis, m)
				return &bsmWorker{c: c, lc: bsmlock.New(c), retry: retry}, nil
			}), nil
		},
	}
	if !tuned {
		s.holder = func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
			c := newRedisClient(b.srv.redis, m)
			return &bsmHolder{c: c, lc: bsmlock.New(c), ttl: ttl, r: newRenewers()}, warmRedis(ctx, c)
		}
	}
	return variant(s, tuned,
		"Client.Obtain with RetryStrategy ExponentialBackoff(16ms, 256ms) (16ms is the minimum its documentation recommends), Lock.Release; renewal: a goroutine per lock calling Lock.Refresh every TTL/3",
		"Client.Obtain with RetryStrategy LinearBackoff(1ms), a retry every millisecond, Lock.Release")
}

// redsyncSubject is redsync over one pool per address: its default retry
// delay, or the tuned 1ms.
func redsyncSubject(b *bench, id string, addrs []string, tuned bool) *subject {
	var opts []redsync.Option
	if tuned {
		opts = append(opts, redsync.WithRetryDelay(time.Millisecond))
	}
	s := &subject{
		id: id, label: fmt.Sprintf("redsync %s, %d pool", modVersion("github.com/go-redsync/redsync/v4"), len(addrs)), group: "redis", redis: addrs,
		fixture: func(ctx context.Context, m *meter) (fixture, error) {
			return perWorker(func(ctx context.Context) (worker, error) { return newRedsyncWorker(addrs, m, opts...), nil }), nil
		},
	}
	if len(addrs) > 1 {
		s.label += "s"
		s.group = "redlock"
	}
	if !tuned && len(addrs) == 1 {
		s.holder = func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
			w := newRedsyncWorker(addrs, m)
			return &redsyncHolder{w: w, ttl: ttl, r: newRenewers()}, warmRedis(ctx, w.clients[0])
		}
	}
	documented := "redsync.New(one go-redis pool), NewMutex with WithExpiry(10s) and WithTries(MaxInt32) so that it waits; its default retry delay, 50–250ms at random; LockContext, UnlockContext; renewal: a goroutine per lock calling ExtendContext every TTL/3"
	fast := "as redsync with 1 pool, with WithRetryDelay(1ms)"
	if len(addrs) > 1 {
		documented = "redsync.New(a go-redis pool per node), otherwise as redsync with 1 pool"
		fast = "as redsync with 5 pools, with WithRetryDelay(1ms)"
	}
	return variant(s, tuned, documented, fast)
}

func rawRedisSubject(b *bench, tuned bool) *subject {
	s := &subject{
		id: "raw-redis", label: "raw SET NX PX + EVALSHA", group: "redis", redis: []string{b.srv.redis},
		fixture: func(ctx context.Context, m *meter) (fixture, error) {
			return perWorker(func(ctx context.Context) (worker, error) {
				return &rawRedisWorker{c: newRedisClient(b.srv.redis, m), linear: tuned}, nil
			}), nil
		},
	}
	if !tuned {
		s.holder = func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
			c := newRedisClient(b.srv.redis, m)
			h := &rawRedisHolder{c: c, ttl: ttl, stop: make(chan struct{})}
			return h, rawRefresh.Load(ctx, c).Err()
		}
	}
	return variant(s, tuned,
		"hand-written floor on go-redis: SET key owner PX ttl NX, retried after a jittered pause growing from 1ms to 32ms; release by an owner-checked DEL script (EVALSHA); renewal: one pipeline of owner-checked PEXPIRE scripts per period for all locks",
		"as raw SET NX PX + EVALSHA, retried every 1ms")
}

// warmRedis opens the client's first connection, outside the measurement.
func warmRedis(ctx context.Context, c *goredis.Client) error { return c.Ping(ctx).Err() }

// guardWorker is a worker on warden's Guard, over any backend.
type guardWorker struct {
	g    *guard.Guard
	opts []guard.LockOption
	cl   closers
}

func (w *guardWorker) cycle(ctx context.Context, key string, section func()) error {
	return w.g.Do(ctx, key, func(context.Context, *guard.Lock) error {
		section()
		return nil
	}, w.opts...)
}

func (w *guardWorker) close() { w.cl.close() }

// guardOn finishes a warden worker whose clients w closes already: a Guard
// with guardOptions over locker, which the worker closes first. When the
// locker could not be made (err), the clients are closed.
func (w *guardWorker) guardOn(locker driver.Locker, err error, opts ...guard.Option) (*guardWorker, error) {
	if err != nil {
		w.close()
		return nil, err
	}
	if c, ok := locker.(interface{ Close() error }); ok {
		w.cl.add(func() { c.Close() })
	}
	if w.g, err = guard.New(locker, guardOptions(opts...)...); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// guardOptions are the Guard options every warden subject uses; more may
// follow (a TTL for the renewal scenario). guard logs each lock it loses;
// the benchmark counts them instead, and 100,000 lines written while the
// keeper is behind would only put it further behind.
func guardOptions(more ...guard.Option) []guard.Option {
	return append([]guard.Option{guard.WithTTL(workerTTL), guard.WithPrefix("bench:"), guard.WithLogger(slog.New(slog.DiscardHandler))}, more...)
}

func newWardenRedis(addr string, m *meter, opts ...guard.Option) (*guardWorker, error) {
	w := &guardWorker{}
	c := newRedisClient(addr, m)
	w.cl.add(func() { c.Close() })
	locker, err := redislock.New(c)
	return w.guardOn(locker, err, opts...)
}

func newWardenRedlock(addrs []string, m *meter) (*guardWorker, error) {
	w := &guardWorker{}
	nodes := make([]goredis.UniversalClient, len(addrs))
	for i, a := range addrs {
		c := newRedisClient(a, m)
		w.cl.add(func() { c.Close() })
		nodes[i] = c
	}
	locker, err := redlock.New(nodes)
	return w.guardOn(locker, err)
}

// guardHolder holds many locks of one Guard; its lease keeper renews them.
type guardHolder struct {
	w     *guardWorker
	ctx   context.Context
	locks []*guard.Lock
	gone  atomic.Int64
}

func newGuardHolder(ctx context.Context, w *guardWorker, warmKey string) (*guardHolder, error) {
	// One cycle first, so that connections and scripts are ready before
	// the heap is measured.
	if err := w.cycle(ctx, warmKey, nop); err != nil {
		w.close()
		return nil, err
	}
	return &guardHolder{w: w, ctx: ctx}, nil
}

func (h *guardHolder) hold(_ context.Context, keys []string) error {
	h.locks = make([]*guard.Lock, len(keys))
	return parallel(h.ctx, len(keys), 16, func(_ context.Context, i int) error {
		// The run's context, not parallel's: a Lock's context derives
		// from the one it was taken with, and these outlive hold.
		l, err := h.w.g.Lock(h.ctx, keys[i])
		h.locks[i] = l
		return err
	})
}

func (h *guardHolder) lost() int { return int(h.gone.Load()) }

// release unlocks every lock; Unlock reports each lock lost while held, or
// found no longer held by its release, with ErrLockLost, once.
func (h *guardHolder) release(ctx context.Context) error {
	return parallel(ctx, len(h.locks), 16, func(ctx context.Context, i int) error {
		if l := h.locks[i]; l != nil {
			err := l.Unlock(ctx)
			if errors.Is(err, guard.ErrLockLost) {
				h.gone.Add(1)
				err = nil
			}
			return err
		}
		return nil
	})
}

func (h *guardHolder) close() { h.w.close() }

// bsmWorker is github.com/bsm/redislock.
type bsmWorker struct {
	c     *goredis.Client
	lc    *bsmlock.Client
	retry func() bsmlock.RetryStrategy
}

func (w *bsmWorker) cycle(ctx context.Context, key string, section func()) error {
	// A strategy has state (its attempt count): one per acquisition.
	lock, err := w.lc.Obtain(ctx, key, workerTTL, &bsmlock.Options{RetryStrategy: w.retry()})
	if err != nil {
		return err
	}
	section()
	rctx, cancel := releaseContext()
	defer cancel()
	return lock.Release(rctx)
}

func (w *bsmWorker) close() { w.c.Close() }

type bsmHolder struct {
	c     *goredis.Client
	lc    *bsmlock.Client
	ttl   time.Duration
	r     *renewers
	locks []*bsmlock.Lock
}

func (h *bsmHolder) hold(ctx context.Context, keys []string) error {
	h.locks = make([]*bsmlock.Lock, len(keys))
	h.r.track(len(keys))
	return parallel(ctx, len(keys), 16, func(ctx context.Context, i int) error {
		l, err := h.lc.Obtain(ctx, keys[i], h.ttl, nil)
		if err != nil {
			return err
		}
		h.locks[i] = l
		h.r.start(i, h.ttl/3, h.ttl, func(ctx context.Context) error {
			err := l.Refresh(ctx, h.ttl, nil)
			if errors.Is(err, bsmlock.ErrNotObtained) {
				err = errNotHeld
			}
			return err
		})
		return nil
	})
}

func (h *bsmHolder) lost() int { return h.r.lost() }

func (h *bsmHolder) release(ctx context.Context) error {
	defer h.r.halt() // see renewers.halt
	return parallel(ctx, len(h.locks), 16, func(ctx context.Context, i int) error {
		l := h.locks[i]
		if l == nil || h.r.releasing(i) {
			return nil
		}
		err := l.Release(ctx)
		h.r.released(i, !errors.Is(err, bsmlock.ErrLockNotHeld))
		if errors.Is(err, bsmlock.ErrLockNotHeld) {
			err = nil
		}
		return err
	})
}

func (h *bsmHolder) close() { h.r.halt(); h.c.Close() }

// redsyncWorker is github.com/go-redsync/redsync over one or more pools.
type redsyncWorker struct {
	clients []*goredis.Client
	rs      *redsync.Redsync
	opts    []redsync.Option
	mu      sync.Mutex
	mutexes map[string]*redsync.Mutex
}

func newRedsyncWorker(addrs []string, m *meter, opts ...redsync.Option) *redsyncWorker {
	w := &redsyncWorker{mutexes: map[string]*redsync.Mutex{}, opts: opts}
	var pools []redsyncredis.Pool
	for _, a := range addrs {
		c := newRedisClient(a, m)
		w.clients = append(w.clients, c)
		pools = append(pools, redsyncgoredis.NewPool(c))
	}
	w.rs = redsync.New(pools...)
	return w
}

func (w *redsyncWorker) mutex(key string, ttl time.Duration) *redsync.Mutex {
	w.mu.Lock()
	defer w.mu.Unlock()
	mu, ok := w.mutexes[key]
	if !ok {
		opts := append([]redsync.Option{redsync.WithExpiry(ttl), redsync.WithTries(math.MaxInt32)}, w.opts...)
		mu = w.rs.NewMutex(key, opts...)
		w.mutexes[key] = mu
	}
	return mu
}

func (w *redsyncWorker) cycle(ctx context.Context, key string, section func()) error {
	mu := w.mutex(key, workerTTL)
	if err := mu.LockContext(ctx); err != nil {
		return err
	}
	section()
	rctx, cancel := releaseContext()
	defer cancel()
	if ok, err := mu.UnlockContext(rctx); err != nil {
		return err
	} else if !ok {
		return errNotHeld
	}
	return nil
}

func (w *redsyncWorker) close() {
	for _, c := range w.clients {
		c.Close()
	}
}

type redsyncHolder struct {
	w    *redsyncWorker
	ttl  time.Duration
	r    *renewers
	held []*redsync.Mutex
}

func (h *redsyncHolder) hold(ctx context.Context, keys []string) error {
	h.held = make([]*redsync.Mutex, len(keys))
	h.r.track(len(keys))
	return parallel(ctx, len(keys), 16, func(ctx context.Context, i int) error {
		mu := h.w.mutex(keys[i], h.ttl)
		if err := mu.LockContext(ctx); err != nil {
			return err
		}
		h.held[i] = mu
		h.r.start(i, h.ttl/3, h.ttl, func(ctx context.Context) error {
			ok, err := mu.ExtendContext(ctx)
			if redsyncNotHeld(ok, err) {
				err = errNotHeld
			}
			return err
		})
		return nil
	})
}

// redsyncNotHeld tells an extension or release that found the lock no
// longer this owner's from one that failed on the way.
func redsyncNotHeld(ok bool, err error) bool {
	var taken *redsync.ErrTaken
	return (err == nil && !ok) || errors.As(err, &taken) || errors.Is(err, redsync.ErrLockAlreadyExpired)
}

func (h *redsyncHolder) lost() int { return h.r.lost() }

func (h *redsyncHolder) release(ctx context.Context) error {
	defer h.r.halt() // see renewers.halt
	return parallel(ctx, len(h.held), 16, func(ctx context.Context, i int) error {
		mu := h.held[i]
		if mu == nil || h.r.releasing(i) {
			return nil
		}
		ok, err := mu.UnlockContext(ctx)
		notHeld := redsyncNotHeld(ok, err)
		h.r.released(i, !notHeld)
		if notHeld {
			err = nil
		}
		return err
	})
}

func (h *redsyncHolder) close() { h.r.halt(); h.w.close() }

var (
	rawRelease = goredis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end return 0`)
	rawRefresh = goredis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) end return 0`)
)

// rawRedisWorker is the least a correct Redis lock can do: one SET per
// attempt, one script per release.
type rawRedisWorker struct {
	c      *goredis.Client
	linear bool
}

// rawSet is SET key owner PX ttl NX: true when taken.
func rawSet(ctx context.Context, c *goredis.Client, key, owner string, ttl time.Duration) (bool, error) {
	err := c.Do(ctx, "set", key, owner, "px", ttl.Milliseconds(), "nx").Err()
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, goredis.Nil):
		return false, nil
	}
	return false, err
}

func (w *rawRedisWorker) cycle(ctx context.Context, key string, section func()) error {
	owner := randomOwner()
	bo := backoff{linear: w.linear}
	for {
		ok, err := rawSet(ctx, w.c, key, owner, workerTTL)
		if err != nil {
			return err
		}
		if ok {
			break
		}
		if err := bo.wait(ctx); err != nil {
			return err
		}
	}
	section()
	rctx, cancel := releaseContext()
	defer cancel()
	n, err := rawRelease.Run(rctx, w.c, []string{key}, owner).Int()
	if err == nil && n != 1 {
		err = errNotHeld
	}
	return err
}

func (w *rawRedisWorker) close() { w.c.Close() }

// rawRedisHolder renews all its locks in one pipeline per period: what a
// careful hand-written keeper would do.
type rawRedisHolder struct {
	c      *goredis.Client
	ttl    time.Duration
	keys   []string
	owners []string
	st     renewers // the locks' states only: one loop renews them all
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

func (h *rawRedisHolder) hold(ctx context.Context, keys []string) error {
	h.keys = keys
	h.owners = make([]string, len(keys))
	h.st.track(len(keys))
	err := parallel(ctx, len(keys), 16, func(ctx context.Context, i int) error {
		h.owners[i] = randomOwner()
		ok, err := rawSet(ctx, h.c, keys[i], h.owners[i], h.ttl)
		if err == nil && !ok {
			err = fmt.Errorf("%s: taken", keys[i])
		}
		return err
	})
	if err != nil {
		return err
	}
	h.done = make(chan struct{})
	go h.renew()
	return nil
}

func (h *rawRedisHolder) renew() {
	defer close(h.done)
	period := h.ttl / 3
	t := time.NewTicker(period)
	defer t.Stop()
	ms := strconv.FormatInt(h.ttl.Milliseconds(), 10)
	last := time.Now() // when the last answered pipeline was sent, at the latest
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), period)
		pipe := h.c.Pipeline()
		cmds := make([]*goredis.Cmd, len(h.keys))
		for i, k := range h.keys {
			cmds[i] = rawRefresh.EvalSha(ctx, pipe, []string{k}, h.owners[i], ms)
		}
		_, err := pipe.Exec(ctx)
		cancel()
		for i, c := range cmds {
			// As renewers.start judges: a lock is lost when the server says
			// it is not held, or when nothing was answered for a TTL.
			n, err := c.Int()
			if (err == nil && n != 1) || (err != nil && sent.Sub(last) >= h.ttl) {
				h.st.lose(i)
			}
		}
		if err == nil {
			last = sent
		}
	}
}

func (h *rawRedisHolder) lost() int { return h.st.lost() }

func (h *rawRedisHolder) halt() {
	h.once.Do(func() {
		close(h.stop)
		if h.done != nil {
			<-h.done
		}
	})
}

func (h *rawRedisHolder) release(ctx context.Context) error {
	defer h.halt() // see renewers.halt
	return parallel(ctx, len(h.keys), 16, func(ctx context.Context, i int) error {
		if h.st.releasing(i) {
			return nil
		}
		n, err := rawRelease.Run(ctx, h.c, []string{h.keys[i]}, h.owners[i]).Int()
		if err == nil {
			h.st.released(i, n == 1)
		}
		return err
	})
}

func (h *rawRedisHolder) close() { h.halt(); h.c.Close() }

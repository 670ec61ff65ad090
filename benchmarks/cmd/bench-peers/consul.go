package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/backends/consullock"
	"github.com/warden-go/warden/guard"
)

// consulMaxLocks bounds the renewal scenario on Consul, where every held
// lock is a key (and for api.Lock a session too) written through raft.
const consulMaxLocks = 10_000

// consulTight is the tuned peers' wait: Consul takes a blocking query's
// wait in milliseconds, so 1ms is the tightest it allows.
const consulTight = time.Millisecond

func consulSubjects(b *bench) []*subject {
	addr := b.srv.consul
	return []*subject{
		{
			id: "warden-consul", label: "warden consullock", group: "consul", warden: true,
			how: "guard.Do over consullock.New(an api.Client per worker, each dialing from a loopback address of its own, as every Consul client here does, so that no address nears the agent's limit of 200 connections); one session (TTL 10s, no health checks, lock-delay 0) per Locker, renewed by one request every TTL/3 for all its locks; acquisition and release are one /v1/txn each, the token the key's ModifyIndex read in the acquiring transaction; a contender that finds the lock held joins a queue of contender keys and blocks (?index=) on its predecessor only, so a release wakes one waiter",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) { return newWardenConsul(addr, m, b.consulSrc.next()) }), nil
			},
			holder: func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
				w, err := newWardenConsul(addr, m, b.consulSrc.next(), guard.WithTTL(ttl))
				if err != nil {
					return nil, err
				}
				return newGuardHolder(ctx, w, b.keyFor("warm-up", "holder", 0, 0, 0))
			},
			minTTL:   consullock.MinTTL,
			maxLocks: consulMaxLocks,
		},
		consulLockSubject(b, false), consulLockSubject(b, true),
		consulSemaphoreSubject(b, false), consulSemaphoreSubject(b, true),
	}
}

// consulVersion checks that the agent answers, with a leader, and returns
// its version for the report.
func consulVersion(ctx context.Context, addr string) (string, error) {
	c, tr, err := newConsulClient(addr, nil, nil)
	if err != nil {
		return "", err
	}
	defer tr.CloseIdleConnections()
	q := (&api.QueryOptions{}).WithContext(ctx)
	leader, err := c.Status().LeaderWithQueryOptions(q)
	if err == nil && leader == "" {
		err = errors.New("no leader")
	}
	if err != nil {
		return "", fmt.Errorf("consul %s: %w", addr, err)
	}
	version := "Consul"
	if self, err := c.Agent().Self(); err == nil {
		if v, ok := self["Config"]["Version"].(string); ok {
			version += " " + v
		}
	}
	return fmt.Sprintf("%s, dev agent (%s)", version, addr), nil
}

// consulTransport counts every HTTP request of one client into a meter: a
// request is a round trip, whatever the verb (a /v1/txn carries several
// operations in one). A blocking query counts once, when it is sent.
//
// It can also tie the requests of an acquisition to the caller's context:
// api.Lock and api.Semaphore look at their stop channel only between
// blocking queries, which wait up to their LockWaitTime, so a waiter told
// to give up at the end of a window would otherwise sit out its query; the
// query is cut instead, as it would be when the process exits, so that the
// next measurement does not wait for it.
type consulTransport struct {
	base  *http.Transport
	m     *meter
	bound atomic.Pointer[context.Context]
}

func (t *consulTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.m != nil {
		name, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/"), "/")
		t.m.sent(r.Method + " " + name)
	}
	if p := t.bound.Load(); p != nil {
		ctx, cancel := context.WithCancel(r.Context())
		stop := context.AfterFunc(*p, cancel)
		resp, err := t.base.RoundTrip(r.WithContext(ctx))
		if err != nil {
			stop()
			cancel()
			return nil, err
		}
		resp.Body = &cancelBody{ReadCloser: resp.Body, done: func() { stop(); cancel() }}
		return resp, nil
	}
	return t.base.RoundTrip(r)
}

// CloseIdleConnections closes the client's idle connections, as the end of
// its process would.
func (t *consulTransport) CloseIdleConnections() { t.base.CloseIdleConnections() }

// bind ties the requests sent from now on to ctx, until unbind.
func (t *consulTransport) bind(ctx context.Context) { t.bound.Store(&ctx) }
func (t *consulTransport) unbind()                  { t.bound.Store(nil) }

// cancelBody releases a bound request's context once its body is closed.
type cancelBody struct {
	io.ReadCloser
	done func()
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.done()
	return err
}

// consulSources hands out loopback source addresses, one per client.
//
// Consul answers 429 to an address with more than http_max_conns_per_client
// (200 by default) connections open, and api.Lock keeps one open per held
// lock (its monitor's blocking query): 64 contenders from one address, or a
// few hundred held locks, would be turned away by a limit meant for one
// host, and so would anyone else sharing the agent from 127.0.0.1 then.
// Each client dials from an address of its own in 127.101.0.0/16, as
// separate hosts would.
type consulSources struct{ n atomic.Uint32 }

func (s *consulSources) next() net.IP {
	n := (s.n.Add(1) - 1) % (250 * 250)
	return net.IPv4(127, 101, byte(n/250), byte(n%250+1))
}

// newConsulClient is one worker's own client, as a separate process would
// have, with api.DefaultConfig's pooled transport dialing from src (nil:
// any), counted into m (nil: not counted).
func newConsulClient(addr string, m *meter, src net.IP) (*api.Client, *consulTransport, error) {
	cfg := api.DefaultConfig()
	cfg.Address = addr
	if src != nil {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		cfg.Transport.DialContext = d.DialContext
	}
	tr := &consulTransport{base: cfg.Transport, m: m}
	cfg.HttpClient = &http.Client{Transport: tr}
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	return c, tr, nil
}

func newWardenConsul(addr string, m *meter, src net.IP, opts ...guard.Option) (*guardWorker, error) {
	w := &guardWorker{}
	c, tr, err := newConsulClient(addr, m, src)
	if err != nil {
		return nil, err
	}
	w.cl.add(tr.CloseIdleConnections)
	locker, err := consullock.New(c)
	return w.guardOn(locker, err, opts...)
}

// consulSession is the session a tuned peer creates once per worker and
// reuses for every acquisition, renewed by one goroutine, instead of the
// session per acquisition api.Lock and api.Semaphore create by default.
type consulSession struct {
	id   string
	stop chan struct{}
	done chan struct{}
}

func newConsulSession(c *api.Client) (*consulSession, error) {
	const ttl = "10s" // Consul's shortest
	id, _, err := c.Session().Create(&api.SessionEntry{
		Name: "bench-peers", TTL: ttl, Behavior: api.SessionBehaviorRelease,
		// 0 would be Consul's default of 15s; the API takes milliseconds.
		LockDelay: time.Millisecond,
	}, nil)
	if err != nil {
		return nil, err
	}
	s := &consulSession{id: id, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		c.Session().RenewPeriodic(ttl, id, nil, s.stop) // destroys the session when stopped
	}()
	return s, nil
}

func (s *consulSession) close() {
	if s != nil {
		close(s.stop)
		<-s.done
	}
}

func consulLockSubject(b *bench, tuned bool) *subject {
	addr := b.srv.consul
	s := &subject{
		id: "consul-lock", label: "Consul api.Lock " + modVersion("github.com/hashicorp/consul/api"), group: "consul",
		fixture: func(ctx context.Context, m *meter) (fixture, error) {
			return perWorker(func(ctx context.Context) (worker, error) {
				return newConsulLockWorker(addr, m, b.consulSrc.next(), tuned)
			}), nil
		},
		minTTL:   consullock.MinTTL,
		maxLocks: consulMaxLocks,
	}
	if !tuned {
		s.holder = func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
			return &consulLockHolder{addr: addr, m: m, src: &b.consulSrc, ttl: ttl}, nil
		}
	}
	return variant(s, tuned,
		"Client.LockOpts with its documented defaults (LockKey's): each Lock creates a session (TTL 15s, Consul's 15s lock-delay) renewed by a goroutine of its own, reads the key and blocks on it (?index=, LockWaitTime 15s) while another session holds it, acquires it (?acquire=), and starts a goroutine monitoring it (a blocking query); Unlock releases it (?release=) and destroys the session; renewal: a session per lock, with its own renewal goroutine (every TTL/2) and monitor, as LockOpts gives every Lock; each monitor keeps an HTTP connection open, and an agent at its default limits answers 429 to an address with more than 200 (measured: one client holding 200 api.Locks was turned away), so the held locks are spread over clients of 100, each dialing from its own loopback address",
		"Client.LockOpts with LockWaitTime, MonitorRetryTime 1ms, the tightest Consul's millisecond waits allow, and the Session option: one session per worker (TTL 10s, lock-delay 1ms), created once and renewed by one goroutine, so that a cycle creates and destroys none; LockRetryTime is a constant of the client (5s): a contender whose acquisition fails and whose re-read then finds the key free (its holder released it in between, which under contention with hold 0 is common) sleeps it out, so that under contention one worker takes almost every turn (the share of acquisitions back to the releaser shows it) and the others sit out their 5s")
}

// consulLockWorker is github.com/hashicorp/consul/api's Lock.
type consulLockWorker struct {
	c       *api.Client
	tr      *consulTransport
	session *consulSession // tuned: the worker's own; nil: one per Lock
	locks   map[string]*api.Lock
}

func newConsulLockWorker(addr string, m *meter, src net.IP, tuned bool) (worker, error) {
	c, tr, err := newConsulClient(addr, m, src)
	if err != nil {
		return nil, err
	}
	w := &consulLockWorker{c: c, tr: tr, locks: map[string]*api.Lock{}}
	if tuned {
		if w.session, err = newConsulSession(c); err != nil {
			tr.CloseIdleConnections()
			return nil, err
		}
	}
	return w, nil
}

func (w *consulLockWorker) cycle(ctx context.Context, key string, section func()) error {
	l, ok := w.locks[key]
	if !ok {
		opts := &api.LockOptions{Key: key}
		if w.session != nil {
			opts.Session = w.session.id
			opts.LockWaitTime = consulTight
			opts.MonitorRetryTime = consulTight
		}
		var err error
		if l, err = w.c.LockOpts(opts); err != nil {
			return err
		}
		w.locks[key] = l
	}
	w.tr.bind(ctx)
	held, err := l.Lock(ctx.Done())
	w.tr.unbind()
	switch {
	case err != nil:
		return err
	case held == nil: // told to stop
		return ctx.Err()
	}
	section()
	return l.Unlock()
}

func (w *consulLockWorker) close() {
	w.session.close()
	w.tr.CloseIdleConnections()
}

// consulLocksPerSource is how many api.Locks the renewal scenario holds
// through one client, which dials from an address of its own: each held
// api.Lock keeps a connection open for its monitor, and Consul turns an
// address away beyond 200 (http_max_conns_per_client's default), room left
// for the requests in flight: an Unlock's release, the session destruction
// it sets off, the pool's idle connections. With 150 a client, releasing
// 10,000 locks 16 at a time from consecutive clients met 429s.
const consulLocksPerSource = 100

// consulLockHolder holds many api.Locks the way LockOpts makes them: each
// with a session of its own, renewed by its own goroutine, and a monitor.
// One process would hold them through one client, and get 429s beyond
// about 200 locks from an agent at its default limits; they are spread over
// clients of consulLocksPerSource locks, each from its own address, so
// that what holding them costs can be measured past that limit.
type consulLockHolder struct {
	addr    string
	m       *meter
	src     *consulSources
	ttl     time.Duration
	clients []*api.Client
	trs     []*consulTransport
	mu      sync.Mutex
	locks   []*api.Lock
	held    []<-chan struct{} // closed when the monitor finds the lock lost
	gone    atomic.Int64
}

func (h *consulLockHolder) hold(ctx context.Context, keys []string) error {
	for range (len(keys) + consulLocksPerSource - 1) / consulLocksPerSource {
		c, tr, err := newConsulClient(h.addr, h.m, h.src.next())
		if err != nil {
			return err
		}
		h.clients = append(h.clients, c)
		h.trs = append(h.trs, tr)
	}
	ttl := h.ttl.String()
	return parallel(ctx, len(keys), 16, func(ctx context.Context, i int) error {
		// Consecutive locks on different clients, so that the 16 at a time
		// taken or released spread over them.
		l, err := h.clients[i%len(h.clients)].LockOpts(&api.LockOptions{Key: keys[i], SessionTTL: ttl})
		if err != nil {
			return err
		}
		held, err := l.Lock(ctx.Done())
		if err == nil && held == nil {
			err = ctx.Err()
		}
		if err != nil {
			return err
		}
		h.mu.Lock()
		h.locks = append(h.locks, l)
		h.held = append(h.held, held)
		h.mu.Unlock()
		return nil
	})
}

func (h *consulLockHolder) lost() int { return int(h.gone.Load()) }

// release unlocks every lock, counting those whose monitor had found them
// lost first: Unlock itself does not tell (it releases the key whoever
// holds it, and the monitor then ends for every lock).
func (h *consulLockHolder) release(ctx context.Context) error {
	h.mu.Lock()
	locks, held := h.locks, h.held
	h.mu.Unlock()
	return parallel(ctx, len(locks), 16, func(ctx context.Context, i int) error {
		select {
		case <-held[i]:
			h.gone.Add(1)
		default:
		}
		return locks[i].Unlock()
	})
}

func (h *consulLockHolder) close() {
	for _, tr := range h.trs {
		tr.CloseIdleConnections()
	}
}

func consulSemaphoreSubject(b *bench, tuned bool) *subject {
	addr := b.srv.consul
	s := &subject{
		id: "consul-semaphore", label: "Consul api.Semaphore, limit 1", group: "consul",
		fixture: func(ctx context.Context, m *meter) (fixture, error) {
			return perWorker(func(ctx context.Context) (worker, error) {
				return newConsulSemaphoreWorker(addr, m, b.consulSrc.next(), tuned)
			}), nil
		},
	}
	return variant(s, tuned,
		"Client.SemaphoreOpts with Limit 1 and its documented defaults (SemaphorePrefix's), as a mutex: each Acquire creates a session (TTL 15s) renewed by a goroutine of its own, writes a contender key, lists the prefix and blocks on it (SemaphoreWaitTime 15s) until the .lock key has room, takes a slot by CAS and starts a monitor on the prefix; Release reads .lock, frees the slot by CAS, deletes the contender key and destroys the session",
		"Client.SemaphoreOpts with Limit 1, SemaphoreWaitTime and MonitorRetryTime 1ms, and one session per worker (TTL 10s, lock-delay 1ms) passed as its Session option")
}

// consulSemaphoreWorker is github.com/hashicorp/consul/api's Semaphore
// with a limit of 1.
type consulSemaphoreWorker struct {
	c       *api.Client
	tr      *consulTransport
	session *consulSession
	sems    map[string]*api.Semaphore
}

func newConsulSemaphoreWorker(addr string, m *meter, src net.IP, tuned bool) (worker, error) {
	c, tr, err := newConsulClient(addr, m, src)
	if err != nil {
		return nil, err
	}
	w := &consulSemaphoreWorker{c: c, tr: tr, sems: map[string]*api.Semaphore{}}
	if tuned {
		if w.session, err = newConsulSession(c); err != nil {
			tr.CloseIdleConnections()
			return nil, err
		}
	}
	return w, nil
}

func (w *consulSemaphoreWorker) cycle(ctx context.Context, key string, section func()) error {
	s, ok := w.sems[key]
	if !ok {
		opts := &api.SemaphoreOptions{Prefix: key, Limit: 1}
		if w.session != nil {
			opts.Session = w.session.id
			opts.SemaphoreWaitTime = consulTight
			opts.MonitorRetryTime = consulTight
		}
		var err error
		if s, err = w.c.SemaphoreOpts(opts); err != nil {
			return err
		}
		w.sems[key] = s
	}
	w.tr.bind(ctx)
	held, err := s.Acquire(ctx.Done())
	w.tr.unbind()
	switch {
	case err != nil:
		return err
	case held == nil:
		return ctx.Err()
	}
	section()
	return s.Release()
}

func (w *consulSemaphoreWorker) close() {
	w.session.close()
	w.tr.CloseIdleConnections()
}

// cleanConsul deletes what this run left in Consul's KV store: api.Lock
// leaves its released keys, and api.Semaphore its .lock key; warden's keys
// go with their release or their session, but a run cut short leaves them
// to expire.
func cleanConsul(ctx context.Context, addr, run string) {
	c, tr, err := newConsulClient(addr, nil, nil)
	if err != nil {
		return
	}
	defer tr.CloseIdleConnections()
	w := (&api.WriteOptions{}).WithContext(ctx)
	c.KV().DeleteTree("bench-peers/"+run+"/", w)
	// warden's keys start with its names path-escaped, guard's prefix
	// included.
	c.KV().DeleteTree(url.PathEscape("bench:bench-peers/"+run+"/"), w)
}

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/guard"
)

// sessionSubjects are the backends whose leases live with a client
// session (etcd, ZooKeeper): renewal there is one keepalive per session,
// whatever the number of locks, for warden and the peers alike, so only the
// cycles are measured.
func sessionSubjects(b *bench) []*subject {
	return []*subject{
		{
			id: "warden-etcd", label: "warden etcdlock", group: "etcd", warden: true,
			how: "guard.Do over etcdlock.New(etcd client); one session (etcd lease) per Locker; a waiter watches its predecessor's key from the current revision",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) { return newWardenEtcd(b.srv.etcd) }), nil
			},
			holder: func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
				w, err := newWardenEtcd(b.srv.etcd, guard.WithTTL(ttl))
				if err != nil {
					return nil, err
				}
				return newGuardHolder(ctx, w.(*guardWorker), b.keyFor("warm-up", "holder", 0, 0, 0))
			},
			maxLocks: etcdMaxLocks,
		},
		{
			id: "etcd-mutex", label: "etcd concurrency.Mutex " + modVersion("go.etcd.io/etcd/client/v3"), group: "etcd",
			how: "one concurrency.Session (TTL 10s) per worker, concurrency.NewMutex per key; Mutex.Lock, Mutex.Unlock",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) { return newEtcdMutexWorker(ctx, b.srv.etcd, b.id, workerTTL) }), nil
			},
			holder: func(ctx context.Context, m *meter, ttl time.Duration) (holder, error) {
				w, err := newEtcdMutexWorker(ctx, b.srv.etcd, b.id, ttl)
				if err != nil {
					return nil, err
				}
				return &etcdMutexHolder{w: w.(*etcdMutexWorker)}, nil
			},
			maxLocks: etcdMaxLocks,
		},
		{
			id: "warden-zk", label: "warden zklock", group: "zk", warden: true,
			how: "guard.Do over zklock.New(servers) with a 10s session; a waiter watches the node it queues behind",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) { return newWardenZK(b.srv.zk) }), nil
			},
		},
		{
			id: "zk-lock", label: "go-zookeeper zk.Lock " + modVersion("github.com/go-zookeeper/zk"), group: "zk",
			how: "one zk.Conn (10s session) per worker, zk.NewLock per key; Lock, Unlock (it has no context, so a waiter cannot give up)",
			fixture: func(ctx context.Context, m *meter) (fixture, error) {
				return perWorker(func(ctx context.Context) (worker, error) { return newZKLockWorker(b.srv.zk, b.id) }), nil
			},
		},
	}
}

func newEtcdClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

func etcdVersion(ctx context.Context, endpoints []string) (string, error) {
	c, err := newEtcdClient(endpoints)
	if err != nil {
		return "", err
	}
	defer c.Close()
	st, err := c.Status(ctx, endpoints[0])
	if err != nil {
		return "", fmt.Errorf("etcd %s: %w", endpoints[0], err)
	}
	return fmt.Sprintf("etcd %s (%s)", st.Version, strings.Join(endpoints, ", ")), nil
}

// etcdMaxLocks bounds the renewal scenario on etcd, whose every held lock
// is a key written under raft: 100,000 of them take minutes to write.
const etcdMaxLocks = 10_000

func newWardenEtcd(endpoints []string, opts ...guard.Option) (worker, error) {
	w := &guardWorker{}
	c, err := newEtcdClient(endpoints)
	if err != nil {
		return nil, err
	}
	w.cl.add(func() { c.Close() })
	locker, err := etcdlock.New(c)
	return w.guardOn(locker, err, opts...)
}

// etcdMutexWorker is go.etcd.io/etcd/client/v3/concurrency's Mutex.
type etcdMutexWorker struct {
	c       *clientv3.Client
	s       *concurrency.Session
	root    string
	mutexes map[string]*concurrency.Mutex
}

func newEtcdMutexWorker(ctx context.Context, endpoints []string, run string, ttl time.Duration) (worker, error) {
	c, err := newEtcdClient(endpoints)
	if err != nil {
		return nil, err
	}
	s, err := concurrency.NewSession(c, concurrency.WithTTL(max(1, int(ttl/time.Second))))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &etcdMutexWorker{c: c, s: s, root: "/bench-peers/" + run + "/", mutexes: map[string]*concurrency.Mutex{}}, nil
}

func (w *etcdMutexWorker) cycle(ctx context.Context, key string, section func()) error {
	mu, ok := w.mutexes[key]
	if !ok {
		mu = concurrency.NewMutex(w.s, w.root+key)
		w.mutexes[key] = mu
	}
	if err := mu.Lock(ctx); err != nil {
		return err
	}
	section()
	rctx, cancel := releaseContext()
	defer cancel()
	return mu.Unlock(rctx)
}

func (w *etcdMutexWorker) close() {
	w.s.Close()
	w.c.Close()
}

// etcdMutexHolder holds many concurrency.Mutexes of one Session, whose
// keepalive renews them all: the peer's own way of keeping locks.
type etcdMutexHolder struct {
	w    *etcdMutexWorker
	mu   sync.Mutex
	held []*concurrency.Mutex
}

func (h *etcdMutexHolder) hold(ctx context.Context, keys []string) error {
	return parallel(ctx, len(keys), 16, func(ctx context.Context, i int) error {
		mu := concurrency.NewMutex(h.w.s, h.w.root+keys[i])
		if err := mu.Lock(ctx); err != nil {
			return err
		}
		h.mu.Lock()
		h.held = append(h.held, mu)
		h.mu.Unlock()
		return nil
	})
}

// lost counts every lock as lost once the session is: it is their only
// lease.
func (h *etcdMutexHolder) lost() int {
	select {
	case <-h.w.s.Done():
		return len(h.held)
	default:
		return 0
	}
}

func (h *etcdMutexHolder) release(ctx context.Context) error {
	return parallel(ctx, len(h.held), 16, func(ctx context.Context, i int) error { return h.held[i].Unlock(ctx) })
}

func (h *etcdMutexHolder) close() { h.w.close() }

// quietZK keeps the ZooKeeper client's connection chatter out of the
// program's output.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

func newWardenZK(servers []string) (worker, error) {
	w := &guardWorker{}
	locker, err := zklock.New(servers, zklock.WithSessionTimeout(workerTTL), zklock.WithLogger(quietZK{}))
	return w.guardOn(locker, err)
}

// zkLockWorker is github.com/go-zookeeper/zk's Lock recipe.
type zkLockWorker struct {
	conn  *zk.Conn
	root  string
	locks map[string]*zk.Lock
}

func zkRoot(run string) string { return "/bench-peers/" + run }

func newZKLockWorker(servers []string, run string) (worker, error) {
	conn, events, err := zk.Connect(servers, workerTTL, zk.WithLogger(quietZK{}), zk.WithLogInfo(false))
	if err != nil {
		return nil, err
	}
	// Connect returns at once and connects in the background; a request
	// made before the session is up fails with ErrNoServer when the first
	// attempt times out, as 64 sessions opening at once on a busy machine
	// can. A careful user of the recipe waits for the session first, as
	// zklock.New does.
	if err := awaitSession(events, workerTTL); err != nil {
		conn.Close()
		return nil, err
	}
	return &zkLockWorker{conn: conn, root: zkRoot(run), locks: map[string]*zk.Lock{}}, nil
}

// awaitSession waits for events to report the session established, at
// most for d.
func awaitSession(events <-chan zk.Event, d time.Duration) error {
	timeout := time.After(d)
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				return nil
			}
		case <-timeout:
			return fmt.Errorf("zk: no session within %v", d)
		}
	}
}

func (w *zkLockWorker) cycle(ctx context.Context, key string, section func()) error {
	l, ok := w.locks[key]
	if !ok {
		// The run's root, then the key with its slashes flattened: the
		// recipe wants a node used by this lock only.
		l = zk.NewLock(w.conn, w.root+"/"+strings.ReplaceAll(key, "/", "_"), zk.WorldACL(zk.PermAll))
		w.locks[key] = l
	}
	if err := l.Lock(); err != nil {
		return err
	}
	section()
	return l.Unlock()
}

func (w *zkLockWorker) close() { w.conn.Close() }

// zkVersion asks the server with the srvr four-letter word, which may be
// disabled: then only the address is reported.
func zkVersion(ctx context.Context, servers []string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", servers[0])
	if err != nil {
		return "", fmt.Errorf("zookeeper %s: %w", servers[0], err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	version := "ZooKeeper"
	if _, err := io.WriteString(conn, "srvr"); err == nil {
		out, _ := io.ReadAll(io.LimitReader(conn, 4096))
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
				v, _, _ = strings.Cut(v, "-")
				v, _, _ = strings.Cut(v, ",")
				version += " " + strings.TrimSpace(v)
			}
		}
	}
	return fmt.Sprintf("%s (%s)", version, strings.Join(servers, ", ")), nil
}

// cleanZK deletes the nodes the zk.Lock workers left: the recipe keeps the
// parent of its queue, a persistent node, forever.
func cleanZK(servers []string, run string) {
	conn, _, err := zk.Connect(servers, workerTTL, zk.WithLogger(quietZK{}), zk.WithLogInfo(false))
	if err != nil {
		return
	}
	defer conn.Close()
	var del func(path string)
	del = func(path string) {
		children, _, err := conn.Children(path)
		if err != nil {
			return
		}
		var wg sync.WaitGroup
		for _, c := range children {
			wg.Add(1)
			go func() { defer wg.Done(); del(path + "/" + c) }()
		}
		wg.Wait()
		conn.Delete(path, -1)
	}
	del(zkRoot(run))
	// Gone only when no other run is using it.
	conn.Delete("/bench-peers", -1)
}

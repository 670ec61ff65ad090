package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-zookeeper/zk"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/backends/redlock"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/backends/sqllock/pglisten"
	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// backends opens what the URLs name, once each: -db, -lock and -idempotency
// naming the same database share one connection pool.
type backends struct {
	sql     map[string]*gorm.DB
	redis   map[string]goredis.UniversalClient
	etcd    map[string]*clientv3.Client
	zk      map[string]*zk.Conn
	closers []func()
	// pings answer /healthz: one per backend in use.
	pings []func(context.Context) error
}

func newBackends() *backends {
	return &backends{
		sql:   map[string]*gorm.DB{},
		redis: map[string]goredis.UniversalClient{},
		etcd:  map[string]*clientv3.Client{},
		zk:    map[string]*zk.Conn{},
	}
}

func (b *backends) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// unreachable is a backend that could not be opened: the message names the
// flag and the (masked) URL, the exit status is 2.
type unreachable struct {
	flag string
	url  *backendURL
	err  error
}

func (e *unreachable) Error() string {
	return fmt.Sprintf("-%s %s: unreachable: %v", e.flag, e.url, maskPassword(e.err.Error()))
}

// openSQL opens a SQL URL and checks the database answers.
func (b *backends) openSQL(ctx context.Context, u *backendURL) (*gorm.DB, error) {
	if db, ok := b.sql[u.raw]; ok {
		return db, nil
	}
	var d gorm.Dialector
	switch u.scheme {
	case "sqlite":
		// WAL and a busy timeout let several replicas share one file.
		d = sqlite.Open(u.path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	case "postgres":
		d = postgres.Open(u.dsn)
	case "mysql":
		d = mysql.Open(u.dsn)
	default:
		return nil, fmt.Errorf("%s is not a SQL database", u)
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pctx); err != nil {
		sqlDB.Close()
		return nil, err
	}
	b.sql[u.raw] = db
	b.closers = append(b.closers, func() { sqlDB.Close() })
	b.pings = append(b.pings, sqlDB.PingContext)
	return db, nil
}

func (b *backends) openRedis(ctx context.Context, addr string) (goredis.UniversalClient, error) {
	if c, ok := b.redis[addr]; ok {
		return c, nil
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, DialTimeout: 2 * time.Second})
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	b.redis[addr] = c
	b.closers = append(b.closers, func() { c.Close() })
	b.pings = append(b.pings, func(ctx context.Context) error { return c.Ping(ctx).Err() })
	return c, nil
}

func (b *backends) openEtcd(ctx context.Context, hosts []string) (*clientv3.Client, error) {
	key := strings.Join(hosts, ",")
	if c, ok := b.etcd[key]; ok {
		return c, nil
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: hosts, DialTimeout: 3 * time.Second})
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Status(pctx, hosts[0]); err != nil {
		c.Close()
		return nil, err
	}
	b.etcd[key] = c
	b.closers = append(b.closers, func() { c.Close() })
	b.pings = append(b.pings, func(ctx context.Context) error { _, err := c.Status(ctx, hosts[0]); return err })
	return c, nil
}

// openZK connects to a ZooKeeper ensemble for the idempotency store. A
// zklock.Locker keeps a session of its own, so this is a second connection to
// the same servers, not a second system.
func (b *backends) openZK(hosts []string) (*zk.Conn, error) {
	key := strings.Join(hosts, ",")
	if c, ok := b.zk[key]; ok {
		return c, nil
	}
	c, _, err := zk.Connect(hosts, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		return nil, err
	}
	b.zk[key] = c
	b.closers = append(b.closers, c.Close)
	return c, nil
}

// locker opens the lock backend u names.
func (b *backends) locker(ctx context.Context, u *backendURL, ttl time.Duration) (driver.Locker, error) {
	switch u.scheme {
	case "memory":
		return memory.New(), nil
	case "sqlite", "postgres", "mysql":
		db, err := b.openSQL(ctx, u)
		if err != nil {
			return nil, err
		}
		var opts []sqllock.Option
		if u.scheme == "postgres" {
			// Waiters hear releases at once instead of at their next poll.
			opts = append(opts, sqllock.WithListener(pglisten.Listener{}))
		}
		l, err := sqllock.New(db, opts...)
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { l.Close() })
		return l, l.Migrate(ctx)
	case "redis":
		c, err := b.openRedis(ctx, u.hosts[0])
		if err != nil {
			return nil, err
		}
		l, err := redislock.New(c)
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { l.Close() })
		return l, nil
	case "redlock":
		var nodes []goredis.UniversalClient
		for _, h := range u.hosts {
			c, err := b.openRedis(ctx, h)
			if err != nil {
				return nil, err
			}
			nodes = append(nodes, c)
		}
		return redlock.New(nodes)
	case "etcd":
		c, err := b.openEtcd(ctx, u.hosts)
		if err != nil {
			return nil, err
		}
		l, err := etcdlock.New(c)
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { l.Close() })
		return l, nil
	case "zk":
		l, err := zklock.New(u.hosts, zklock.WithSessionTimeout(ttl))
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { l.Close() })
		return l, nil
	}
	return nil, fmt.Errorf("%s: not a lock backend", u)
}

// errNoStore: the backend has no idempotency store.
var errNoStore = errors.New("no idempotency store on this backend")

// store opens the idempotency store u names, or errNoStore.
func (b *backends) store(ctx context.Context, u *backendURL) (idempotency.Store, error) {
	switch u.scheme {
	case "memory":
		return idempotency.NewMemoryStore(), nil
	case "sqlite", "postgres", "mysql":
		db, err := b.openSQL(ctx, u)
		if err != nil {
			return nil, err
		}
		s, err := sqllock.NewStore(db)
		if err != nil {
			return nil, err
		}
		return s, s.Migrate(ctx)
	case "redis":
		c, err := b.openRedis(ctx, u.hosts[0])
		if err != nil {
			return nil, err
		}
		return redislock.NewStore(c)
	case "etcd":
		c, err := b.openEtcd(ctx, u.hosts)
		if err != nil {
			return nil, err
		}
		return etcdlock.NewStore(c)
	case "zk":
		c, err := b.openZK(u.hosts)
		if err != nil {
			return nil, err
		}
		s, err := zklock.NewStore(c)
		if err != nil {
			return nil, err
		}
		// The client connects in the background: only a request tells
		// whether the ensemble is there.
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := s.Ping(pctx); err != nil {
			return nil, err
		}
		b.pings = append(b.pings, s.Ping)
		return s, nil
	}
	return nil, fmt.Errorf("%s: %w", u, errNoStore)
}

//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-zookeeper/zk"
	"github.com/hashicorp/consul/api"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/consullock"
	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/backends/redlock"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/backends/sqllock/pglisten"
	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// lockKey is the one key every worker locks, under the scenario's prefix.
const lockKey = "counter"

// backendSpec says how a process reaches one backend: what a worker needs to
// build its Locker, and the test to look for leftovers.
type backendSpec struct {
	Kind   string   `json:"kind"` // redis, redlock, etcd, zk, sqlite, postgres, mariadb, consul
	Addrs  []string `json:"addrs,omitempty"`
	DSN    string   `json:"dsn,omitempty"`
	Fair   bool     `json:"fair,omitempty"`   // redis: guard.Fair() on every Do
	Listen bool     `json:"listen,omitempty"` // postgres: pglisten; without it, WithoutNotify
	Table  string   `json:"table,omitempty"`  // sql
	Root   string   `json:"root,omitempty"`   // zk
}

// endpoints are the host:port pairs a client of spec connects to, which a
// proxy can stand in for.
func (b backendSpec) endpoints() []string {
	switch b.Kind {
	case "postgres":
		u, err := url.Parse(b.DSN)
		if err != nil {
			return nil
		}
		return []string{u.Host}
	case "mariadb":
		i, j := strings.Index(b.DSN, "tcp("), strings.Index(b.DSN, ")/")
		if i < 0 || j < i {
			return nil
		}
		return []string{b.DSN[i+4 : j]}
	case "sqlite":
		return nil
	}
	return b.Addrs
}

// via returns spec with each endpoint replaced by its stand-in.
func (b backendSpec) via(standIn map[string]string) backendSpec {
	out := b
	switch b.Kind {
	case "postgres", "mariadb":
		for from, to := range standIn {
			out.DSN = strings.Replace(out.DSN, from, to, 1)
		}
	default:
		out.Addrs = nil
		for _, a := range b.Addrs {
			out.Addrs = append(out.Addrs, standIn[a])
		}
	}
	return out
}

// redisTag is the hash tag of the Redis keys of lock full, as both Redis
// backends name them. Prefixes here never contain the '{', '}' or '%' that
// the backends would escape.
func redisTag(full string) string { return "{" + full + "}" }

type discardZK struct{}

func (discardZK) Printf(string, ...any) {}

// openLocker builds the Locker a worker locks with, the options of its Do,
// and what to close when it is done.
func openLocker(b backendSpec, ttl time.Duration) (driver.Locker, []guard.LockOption, func(), error) {
	switch b.Kind {
	case "redis":
		c := goredis.NewClient(&goredis.Options{Addr: b.Addrs[0], DialTimeout: time.Second, ContextTimeoutEnabled: true})
		// A waiter timeout under the TTL: a fair waiter that was cut off
		// must not hold the queue up for longer than a dead holder would.
		l, err := redislock.New(c, redislock.WithWaiterTimeout(time.Second))
		if err != nil {
			c.Close()
			return nil, nil, nil, err
		}
		var opts []guard.LockOption
		if b.Fair {
			opts = append(opts, guard.Fair())
		}
		return l, opts, func() { l.Close(); c.Close() }, nil
	case "redlock":
		var nodes []goredis.UniversalClient
		for _, a := range b.Addrs {
			nodes = append(nodes, goredis.NewClient(&goredis.Options{Addr: a, DialTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true}))
		}
		closeAll := func() {
			for _, n := range nodes {
				n.Close()
			}
		}
		l, err := redlock.New(nodes)
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		return l, nil, closeAll, nil
	case "etcd":
		c, err := clientv3.New(clientv3.Config{Endpoints: b.Addrs, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, nil, err
		}
		l, err := etcdlock.New(c, etcdlock.WithRequestTimeout(time.Second))
		if err != nil {
			c.Close()
			return nil, nil, nil, err
		}
		return l, nil, func() { l.Close(); c.Close() }, nil
	case "zk":
		l, err := zklock.New(b.Addrs, zklock.WithSessionTimeout(ttl), zklock.WithRoot(b.Root), zklock.WithLogger(discardZK{}))
		if err != nil {
			return nil, nil, nil, err
		}
		return l, nil, func() { l.Close() }, nil
	case "sqlite", "postgres", "mariadb":
		db, err := openGorm(b)
		if err != nil {
			return nil, nil, nil, err
		}
		pool, _ := db.DB()
		opts := []sqllock.Option{sqllock.WithTable(b.Table)}
		if b.Kind == "postgres" {
			if b.Listen {
				opts = append(opts, sqllock.WithListener(pglisten.Listener{}))
			} else {
				opts = append(opts, sqllock.WithoutNotify())
			}
		}
		l, err := sqllock.New(db, opts...)
		if err != nil {
			pool.Close()
			return nil, nil, nil, err
		}
		return l, nil, func() { l.Close(); pool.Close() }, nil
	case "consul":
		c, err := consulClient(b.Addrs[0])
		if err != nil {
			return nil, nil, nil, err
		}
		// A request timeout under the TTL, as etcd's above: a renewal
		// that hangs on a cut connection is tried again well before the
		// session's expiry.
		l, err := consullock.New(c, consullock.WithRequestTimeout(time.Second))
		if err != nil {
			return nil, nil, nil, err
		}
		return l, nil, func() { l.Close() }, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown backend %q", b.Kind)
}

// consulClient is a Consul API client of addr with the library's default
// options (api.DefaultConfig, whose pooled transport has no timeouts).
func consulClient(addr string) (*api.Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address = addr
	return api.NewClient(cfg)
}

func openGorm(b backendSpec) (*gorm.DB, error) {
	var d gorm.Dialector
	switch b.Kind {
	case "sqlite":
		d = sqlite.Open(b.DSN)
	case "postgres":
		d = postgres.Open(b.DSN)
	case "mariadb":
		d = mysql.Open(b.DSN)
	default:
		return nil, fmt.Errorf("%s is not a SQL backend", b.Kind)
	}
	return gorm.Open(d, &gorm.Config{Logger: logger.Discard})
}

// migrate creates the lock table before any worker starts, so that workers
// do not race each other's DDL.
func migrate(ctx context.Context, b backendSpec) error {
	db, err := openGorm(b)
	if err != nil {
		return err
	}
	pool, _ := db.DB()
	defer pool.Close()
	l, err := sqllock.New(db, sqllock.WithTable(b.Table))
	if err != nil {
		return err
	}
	defer l.Close()
	return l.Migrate(ctx)
}

// redisStateFree reports whether key holds a free Redis or RedLock lock
// state ("<deadline ms>:<token>:..."): a deadline of 0 (released) or one
// the server's clock has passed (expired).
func redisStateFree(ctx context.Context, c *goredis.Client, key string) bool {
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		return false
	}
	head, _, ok := strings.Cut(v, ":")
	deadline, err := strconv.ParseInt(head, 10, 64)
	if !ok || err != nil {
		return false
	}
	now, err := c.Time(ctx).Result()
	return err == nil && deadline <= now.UnixMilli()
}

// leftovers lists what the workload left on the backend once every worker
// has exited: anything but the state the backend keeps by design (a Redis
// or RedLock lock's state key once free, which stays as its fence, SQL rows whose lease has ended, empty ZooKeeper
// container nodes).
func leftovers(ctx context.Context, b backendSpec, prefix string) ([]string, error) {
	full := prefix + lockKey
	switch b.Kind {
	case "redis", "redlock":
		tag := redisTag(full)
		var out []string
		for _, a := range b.Addrs {
			c := goredis.NewClient(&goredis.Options{Addr: a})
			keys, err := c.Keys(ctx, tag+"*").Result()
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("%s: %w", a, err)
			}
			for _, k := range keys {
				if k == tag+":lock" && redisStateFree(ctx, c, k) {
					continue
				}
				ttl, _ := c.PTTL(ctx, k).Result()
				typ, _ := c.Type(ctx, k).Result()
				out = append(out, fmt.Sprintf("%s: %s (%s, pttl %v)", a, k, typ, ttl))
			}
			c.Close()
		}
		return out, nil
	case "etcd":
		c, err := clientv3.New(clientv3.Config{Endpoints: b.Addrs, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
		defer c.Close()
		resp, err := c.Get(ctx, etcdlock.KeyDir(full), clientv3.WithPrefix())
		if err != nil {
			return nil, err
		}
		var out []string
		for _, kv := range resp.Kvs {
			ttl := "?"
			if lr, err := c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease)); err == nil {
				ttl = fmt.Sprintf("%ds", lr.TTL)
			}
			out = append(out, fmt.Sprintf("%s (lease %x, %s to live)", kv.Key, kv.Lease, ttl))
		}
		return out, nil
	case "zk":
		conn, err := dialZK(b.Addrs)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		var out []string
		err = walkZK(conn, b.Root, func(p string, st *zk.Stat) {
			if st.EphemeralOwner != 0 {
				out = append(out, fmt.Sprintf("%s (ephemeral of session %x)", p, st.EphemeralOwner))
			}
		})
		return out, err
	case "sqlite", "postgres", "mariadb":
		db, err := openGorm(b)
		if err != nil {
			return nil, err
		}
		pool, _ := db.DB()
		defer pool.Close()
		type row struct {
			Name      string
			Owner     string
			Version   int64
			LockUntil int64
		}
		var rows []row
		// Every server here runs on this host, so this clock is the
		// database's.
		now := time.Now().UnixMicro()
		if err := db.WithContext(ctx).Table(b.Table).Where("lock_until > ?", now).Find(&rows).Error; err != nil {
			return nil, err
		}
		var out []string
		for _, r := range rows {
			out = append(out, fmt.Sprintf("row %q owner %s version %d held for %v more", r.Name, r.Owner, r.Version,
				time.Duration(r.LockUntil-now)*time.Microsecond))
		}
		return out, nil
	case "consul":
		// The lock key and its fair queue's keys, all under LockKey;
		// they are acquired by a session, with behaviour delete, so a
		// key left here is a session left alive.
		// Connections not kept: this runs often, against the shared
		// agent, which refuses an address more than 200 open ones.
		cfg := api.DefaultNonPooledConfig()
		cfg.Address = b.Addrs[0]
		c, err := api.NewClient(cfg)
		if err != nil {
			return nil, err
		}
		pairs, _, err := c.KV().List(consullock.LockKey(full), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
		if err != nil {
			return nil, err
		}
		var out []string
		for _, p := range pairs {
			out = append(out, fmt.Sprintf("%s (session %s, modify index %d)", p.Key, p.Session, p.ModifyIndex))
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown backend %q", b.Kind)
}

// cleanup removes what the workload kept by design, so that the shared
// servers do not fill up with one scenario's state per run.
func cleanup(ctx context.Context, b backendSpec, prefix string) error {
	full := prefix + lockKey
	switch b.Kind {
	case "redis", "redlock":
		var errs []error
		for _, a := range b.Addrs {
			c := goredis.NewClient(&goredis.Options{Addr: a})
			errs = append(errs, c.Del(ctx, redisTag(full)+":fence").Err())
			c.Close()
		}
		return errors.Join(errs...)
	case "zk":
		conn, err := dialZK(b.Addrs)
		if err != nil {
			return err
		}
		defer conn.Close()
		return deleteZK(conn, b.Root)
	case "postgres", "mariadb":
		db, err := openGorm(b)
		if err != nil {
			return err
		}
		pool, _ := db.DB()
		defer pool.Close()
		return db.WithContext(ctx).Migrator().DropTable(b.Table)
	}
	return nil
}

func dialZK(servers []string) (*zk.Conn, error) {
	conn, ev, err := zk.Connect(servers, 5*time.Second, zk.WithLogger(discardZK{}), zk.WithLogInfo(false))
	if err != nil {
		return nil, err
	}
	deadline := time.After(15 * time.Second)
	for {
		select {
		case e := <-ev:
			if e.State == zk.StateHasSession {
				return conn, nil
			}
		case <-deadline:
			conn.Close()
			return nil, fmt.Errorf("zookeeper %v: no session after 15s", servers)
		}
	}
}

func walkZK(conn *zk.Conn, p string, visit func(string, *zk.Stat)) error {
	kids, st, err := conn.Children(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	visit(p, st)
	for _, k := range kids {
		if err := walkZK(conn, path.Join(p, k), visit); err != nil {
			return err
		}
	}
	return nil
}

// deleteZK removes p and everything under it, then its parents while they
// are empty.
func deleteZK(conn *zk.Conn, p string) error {
	kids, _, err := conn.Children(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, k := range kids {
		if err := deleteZK(conn, path.Join(p, k)); err != nil {
			return err
		}
	}
	if err := conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	if parent := path.Dir(p); parent != "/" {
		if kids, _, err := conn.Children(parent); err == nil && len(kids) == 0 {
			conn.Delete(parent, -1)
		}
	}
	return nil
}

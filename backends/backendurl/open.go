package backendurl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-zookeeper/zk"
	consulapi "github.com/hashicorp/consul/api"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/consullock"
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

// Opener opens what URLs name, once each: a lock backend and a store on the
// same database share one connection pool. It is not safe for concurrent
// use. Close closes everything it opened.
//
// An open checks that the server answers, and fails when the caller's
// context ends (or after 5 s), even on a server that accepts connections
// and never answers. The Redis clients it makes honour their callers'
// context deadlines (go-redis's ContextTimeoutEnabled), so that a health
// check or a command on a server that stopped answering ends with its
// caller's bound rather than go-redis's read timeout and retries.
type Opener struct {
	// KeepSchema, set before the first open, has the SQL opens change no
	// schema: they migrate no table, and fail, saying so, when the table
	// the Locker or the Store reads is not there. A tool that only looks
	// at what services wrote, or changes their rows (an operator's), then
	// needs no right but to read (and write) rows, and works on a
	// read-only connection: a replica, a role granted SELECT alone, a
	// read-only SQLite file.
	KeepSchema bool

	sql     map[string]*gorm.DB
	redis   map[string]goredis.UniversalClient
	etcd    map[string]*clientv3.Client
	zk      map[string]*zk.Conn
	consul  map[string]*consulapi.Client
	closers []func()
	pings   []Ping
}

// Ping checks one server the Opener connected to.
type Ping struct {
	// Backend names what is checked by its scheme (redis, postgres, zk,
	// ...), which a health endpoint may show where it must not show the
	// error's text.
	Backend string
	// Check returns nil when the server answers within ctx.
	Check func(context.Context) error
}

// Pings returns one check per server the Opener connected to, for a health
// endpoint.
func (b *Opener) Pings() []Ping { return b.pings }

// NewOpener returns an Opener that has opened nothing yet.
func NewOpener() *Opener {
	return &Opener{
		sql:    map[string]*gorm.DB{},
		redis:  map[string]goredis.UniversalClient{},
		etcd:   map[string]*clientv3.Client{},
		zk:     map[string]*zk.Conn{},
		consul: map[string]*consulapi.Client{},
	}
}

// Close closes every client and Locker the Opener opened, last first.
func (b *Opener) Close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

// SQL opens the SQL database u names and checks that it answers. Its
// errors, like Locker's and Store's, quote none of u's secrets.
func (b *Opener) SQL(ctx context.Context, u *URL) (*gorm.DB, error) {
	db, err := b.openSQL(ctx, u)
	return db, u.RedactError(err)
}

func (b *Opener) openSQL(ctx context.Context, u *URL) (*gorm.DB, error) {
	key := u.Scheme + "\x00" + u.Path + u.DSN
	if db, ok := b.sql[key]; ok {
		return db, nil
	}
	// A server that accepts connections and never answers must fail the
	// open when ctx ends. gorm.Open pings (postgres) and asks MySQL's
	// version with no context: its ping is off, ours has ctx, and MySQL's
	// version is asked only once a bounded ping has opened the connection
	// it goes over (a server that stops answering just between the two
	// still holds the open: gorm gives no way to bound that query).
	var (
		d     gorm.Dialector
		sqlDB *sql.DB
	)
	switch u.Scheme {
	case "sqlite":
		// SQLite reports a missing directory as "out of memory (14)".
		name, params, hasParams := strings.Cut(u.Path, "?")
		if dir := filepath.Dir(name); !strings.HasPrefix(name, "file:") {
			if _, err := os.Stat(dir); err != nil {
				return nil, fmt.Errorf("the directory of %s: %w", u.Path, err)
			}
		}
		// WAL and a busy timeout let several replicas share one file;
		// they join the path's own parameters, if it has some (a second
		// '?' would make them part of the value before it). A read-only
		// connection (a file: URI's mode=ro; SQLite reads no mode from
		// a plain path's parameters) cannot switch the file's journal,
		// and need not: it reads the file in whichever its writers use.
		sep := "?"
		if hasParams {
			sep = "&"
		}
		pragmas := "_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)"
		if q, _ := url.ParseQuery(params); strings.HasPrefix(name, "file:") && q.Get("mode") == "ro" {
			pragmas = "_pragma=busy_timeout(10000)"
		}
		dsn := u.Path + sep + pragmas
		var err error
		if sqlDB, err = sql.Open(sqlite.DriverName, dsn); err != nil {
			return nil, err
		}
		if err := pingSQL(ctx, sqlDB); err != nil {
			return nil, err
		}
		d = &sqlite.Dialector{DSN: dsn, Conn: sqlDB}
	case "postgres":
		d = postgres.Open(u.DSN)
	case "mysql":
		var err error
		if sqlDB, err = sql.Open("mysql", u.DSN); err != nil {
			return nil, err
		}
		if err := pingSQL(ctx, sqlDB); err != nil {
			return nil, err
		}
		d = mysql.New(mysql.Config{DSN: u.DSN, Conn: sqlDB})
	default:
		return nil, errors.New("not a SQL database")
	}
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard, DisableAutomaticPing: true})
	if err != nil {
		if sqlDB != nil {
			sqlDB.Close()
		}
		return nil, err
	}
	if sqlDB == nil {
		if sqlDB, err = db.DB(); err != nil {
			return nil, err
		}
		if err := pingSQL(ctx, sqlDB); err != nil {
			return nil, err
		}
	}
	b.sql[key] = db
	b.closers = append(b.closers, func() { sqlDB.Close() })
	b.pings = append(b.pings, Ping{u.Scheme, sqlDB.PingContext})
	return db, nil
}

// pingSQL checks that db's server answers within ctx, and at most 5s, and
// closes db if it does not.
//
// An SQLite file another connection is writing in its rollback journal (a
// replica creating its tables in a fresh file) refuses the switch to WAL
// that each connection makes on opening with SQLITE_BUSY at once: that
// switch waits for no busy timeout. The ping tries again until the writer
// is done, within the same bound; a file still locked then is reported as
// such, with SQLite's last SQLITE_BUSY.
func pingSQL(ctx context.Context, db *sql.DB) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var busy error
	for pause := time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		err := db.PingContext(pctx)
		if err == nil {
			return nil
		}
		if sqliteBusy(err) {
			busy = err
		} else if busy == nil || pctx.Err() == nil {
			db.Close()
			return driver.Unavailable(ctx, err)
		}
		select {
		case <-time.After(pause):
		case <-pctx.Done():
			db.Close()
			return driver.Unavailable(ctx, fmt.Errorf("the SQLite file stayed locked by another connection's write: %w", busy))
		}
	}
}

// sqliteBusy says whether err is SQLite's SQLITE_BUSY (5), or one of its
// extended codes.
func sqliteBusy(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 5
}

func (b *Opener) openRedis(ctx context.Context, o *goredis.Options) (goredis.UniversalClient, error) {
	if c, ok := b.redis[redisKey(o)]; ok {
		return c, nil
	}
	c := newRedis(o)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		return nil, driver.Unavailable(ctx, fmt.Errorf("%s: %w", o.Addr, err))
	}
	b.keepRedis(o, c)
	b.pings = append(b.pings, Ping{"redis", func(ctx context.Context) error { return c.Ping(ctx).Err() }})
	return c, nil
}

// redlockMaster returns the client of a RedLock master, whether the master
// answers now or not: a RedLock needs a majority of its masters, not every
// one, which the Locker's own Ping checks (and the health check after it).
func (b *Opener) redlockMaster(o *goredis.Options) goredis.UniversalClient {
	if c, ok := b.redis[redisKey(o)]; ok {
		return c
	}
	c := newRedis(o)
	b.keepRedis(o, c)
	return c
}

// redisKey tells apart the Redis clients an Opener makes: one per server,
// user, password, database and TLS.
func redisKey(o *goredis.Options) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%d\x00%t", o.Addr, o.Username, o.Password, o.DB, o.TLSConfig != nil)
}

// keepRedis keeps c, the client for o, to be used again and closed.
func (b *Opener) keepRedis(o *goredis.Options, c goredis.UniversalClient) {
	b.redis[redisKey(o)] = c
	b.closers = append(b.closers, func() { c.Close() })
}

// newRedis makes a client for o.
func newRedis(o *goredis.Options) *goredis.Client {
	opts := *o // ParseURL's answer, kept for the next node of a RedLock
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 2 * time.Second
	}
	// Without it go-redis bounds a command by its read timeout and
	// retries, whatever the caller's context says: an open, a health check
	// or an operator's command against a server that stopped answering
	// would outlast the caller's bound.
	opts.ContextTimeoutEnabled = true
	return goredis.NewClient(&opts)
}

func (b *Opener) openEtcd(u *URL) (*clientv3.Client, error) {
	hosts := u.Hosts
	key := strings.Join(hosts, ",") + "\x00" + u.username + "\x00" + u.password
	if c, ok := b.etcd[key]; ok {
		return c, nil
	}
	// The client's own log would print a line per retry: the error the
	// caller gets says it once.
	c, err := clientv3.New(clientv3.Config{Endpoints: u.Hosts, Username: u.username, Password: u.password,
		DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	// No check here: the Locker's and the Store's Pings, which their
	// opens call, read linearizably, which needs the cluster's leader and a
	// quorum; a member that has lost them still answers its status.
	b.etcd[key] = c
	b.closers = append(b.closers, func() { c.Close() })
	return c, nil
}

// openZK connects to the ZooKeeper ensemble u names for the idempotency
// store, with u's digest credentials if it has some. A zklock.Locker keeps
// a session of its own, so this is a second connection to the same
// servers, not a second system.
func (b *Opener) openZK(ctx context.Context, u *URL) (*zk.Conn, error) {
	key := strings.Join(u.Hosts, ",") + "\x00" + u.username + "\x00" + u.password
	if c, ok := b.zk[key]; ok {
		return c, nil
	}
	c, _, err := zk.Connect(u.Hosts, 10*time.Second, zk.WithLogger(quietZK{}))
	if err != nil {
		return nil, err
	}
	if u.username != "" {
		if err := addDigest(ctx, c, u); err != nil {
			c.Close()
			return nil, err
		}
	}
	b.zk[key] = c
	b.closers = append(b.closers, c.Close)
	return c, nil
}

// digest is u's digest credentials, as ZooKeeper takes them.
func (u *URL) digest() []byte { return []byte(u.username + ":" + u.password) }

// userACL is the ACL of the nodes made with u's digest credentials: their
// user's alone, as the ensemble that asks for them would have it. It is
// zk.AuthACL, which the server writes as the user's digest ACL with the
// hash it computes itself: zk.DigestACL's, SHA-1 over the password's
// bytes, differs from it on a server with another algorithm (digestAlg)
// or that decodes the password otherwise (a non-ASCII one under a charset
// other than UTF-8), and would lock every session out, the creator's too.
func userACL() []zk.ACL { return zk.AuthACL(zk.PermAll) }

// addDigest adds u's digest credentials to c. Conn.AddAuth waits for the
// session and takes no context: it is waited for within ctx, and at most
// 5 s, as the Opener's checks are. go-zookeeper sends the credentials
// again on each connection after.
func addDigest(ctx context.Context, c *zk.Conn, u *URL) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.AddAuth("digest", u.digest()) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("zookeeper digest credentials of user %q: %w", u.username, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("zookeeper digest credentials of user %q: no answer: %w", u.username, ctx.Err())
	}
}

// openConsul returns a client of the Consul agent at host, one per agent:
// a Locker and a Store on it share the client's connections.
func (b *Opener) openConsul(host string) (*consulapi.Client, error) {
	if c, ok := b.consul[host]; ok {
		return c, nil
	}
	cfg := consulapi.DefaultConfig()
	cfg.Address = host
	c, err := consulapi.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	b.consul[host] = c
	return c, nil
}

// Locker opens the lock backend u names, and checks that it answers (a
// client that connects in the background would otherwise fail only at the
// first lock), and migrates its tables on SQL, unless KeepSchema is set.
// ttl is the lock TTL the program will use; ZooKeeper's session timeout is
// set to it.
func (b *Opener) Locker(ctx context.Context, u *URL, ttl time.Duration) (driver.Locker, error) {
	l, err := b.locker(ctx, u, ttl)
	if err != nil {
		return nil, u.RedactError(err)
	}
	if p, ok := l.(driver.Pinger); ok {
		if err := b.check(ctx, u.Scheme, p.Ping); err != nil {
			return nil, u.RedactError(err)
		}
	}
	return l, nil
}

// check calls ping within ctx, and at most 5 s, and keeps it for the
// health endpoint (Pings) if it passes.
func (b *Opener) check(ctx context.Context, backend string, ping func(context.Context) error) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := ping(pctx); err != nil {
		return err
	}
	b.pings = append(b.pings, Ping{backend, ping})
	return nil
}

func (b *Opener) locker(ctx context.Context, u *URL, ttl time.Duration) (driver.Locker, error) {
	switch u.Scheme {
	case "memory":
		return memory.New(), nil
	case "sqlite", "postgres", "mysql":
		db, err := b.openSQL(ctx, u)
		if err != nil {
			return nil, err
		}
		var opts []sqllock.Option
		if u.Scheme == "postgres" {
			// Waiters hear releases at once instead of at their next poll.
			opts = append(opts, sqllock.WithListener(pglisten.Listener{}))
		}
		l, err := sqllock.New(db, opts...)
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { l.Close() })
		if b.KeepSchema {
			return l, existing(ctx, db, "lock", sqllock.DefaultTable, l.Check)
		}
		return l, l.Migrate(ctx)
	case "redis":
		c, err := b.openRedis(ctx, u.redis[0])
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
		for _, o := range u.redis {
			nodes = append(nodes, b.redlockMaster(o))
		}
		return redlock.New(nodes)
	case "etcd":
		c, err := b.openEtcd(u)
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
		opts := []zklock.Option{zklock.WithSessionTimeout(ttl), zklock.WithLogger(quietZK{})}
		if u.username != "" {
			opts = append(opts, zklock.WithAuth("digest", u.digest()), zklock.WithACL(userACL()...))
		}
		l, err := zklock.New(u.Hosts, opts...)
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { l.Close() })
		return l, nil
	case "consul":
		c, err := b.openConsul(u.Hosts[0])
		if err != nil {
			return nil, err
		}
		l, err := consullock.New(c)
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, func() { l.Close() })
		return l, nil
	}
	return nil, fmt.Errorf("%s: not a lock backend", u)
}

// ErrNoStore: the backend has no idempotency store (RedLock).
var ErrNoStore = errors.New("no idempotency store on this backend")

// existing checks that table, the what table, is there and can be read,
// for an Opener that keeps the schema: on a database no service has used
// (a URL naming another one), every read would otherwise fail with the
// driver's words alone. The table is said missing only when the database
// says so; a read that fails otherwise is given as it is. check (the
// Locker's or the Store's) then checks, as Migrate would have, that the
// table and the session fit.
func existing(ctx context.Context, db *gorm.DB, what, table string, check func(context.Context) error) error {
	tx := db.WithContext(ctx)
	err := tx.Exec("SELECT 1 FROM " + tx.Statement.Quote(table) + " WHERE 1 = 0").Error
	if err == nil {
		return check(ctx)
	}
	if absent, _ := tableAbsent(ctx, db, table); absent {
		return describe(err, "no %s table %s on this database that this user may see (no service has used the database, or the URL names another one; the schema is left as it is)",
			what, table)
	}
	if sqliteReadOnlyDirectory(err) {
		return describe(err, "reading the %s table %s: a read-only open of an SQLite file in WAL mode needs its -shm file, or a directory it may write to make one (or immutable=1, when nothing writes the file)",
			what, table)
	}
	return driver.Unavailable(ctx, fmt.Errorf("reading the %s table %s: %w", what, table, err))
}

// tableAbsent reports whether the database says that it has no table of
// that name in the connection's schema (one the user may see, on MySQL).
// gorm's HasTable is false on any error too, which told a read that
// failed for another reason (a read-only SQLite file it cannot map) as a
// missing table.
func tableAbsent(ctx context.Context, db *gorm.DB, table string) (bool, error) {
	var q string
	switch db.Dialector.Name() {
	case "postgres":
		q = "SELECT count(*) FROM pg_catalog.pg_class WHERE oid = to_regclass(?)"
	case "mysql":
		q = "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?"
	default:
		q = "SELECT count(*) FROM sqlite_master WHERE name = ?"
	}
	var n int64
	if err := db.WithContext(ctx).Raw(q, table).Scan(&n).Error; err != nil {
		return false, err
	}
	return n == 0, nil
}

// sqliteReadOnlyDirectory says whether err is SQLITE_READONLY_DIRECTORY:
// a read-only connection to a file in WAL mode found no -shm file beside
// it, and may not create one.
func sqliteReadOnlyDirectory(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code() == 1544 // SQLITE_READONLY | 6<<8
}

// Store opens the idempotency store u names (and migrates its table on
// SQL, unless KeepSchema is set), or returns an error wrapping ErrNoStore.
func (b *Opener) Store(ctx context.Context, u *URL) (idempotency.Store, error) {
	s, err := b.store(ctx, u)
	return s, u.RedactError(err)
}

func (b *Opener) store(ctx context.Context, u *URL) (idempotency.Store, error) {
	switch u.Scheme {
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
		if b.KeepSchema {
			return s, existing(ctx, db, "idempotency", sqllock.DefaultIdempotencyTable, s.Check)
		}
		return s, s.Migrate(ctx)
	case "redis":
		c, err := b.openRedis(ctx, u.redis[0])
		if err != nil {
			return nil, err
		}
		return redislock.NewStore(c)
	case "etcd":
		c, err := b.openEtcd(u)
		if err != nil {
			return nil, err
		}
		s, err := etcdlock.NewStore(c)
		if err != nil {
			return nil, err
		}
		return s, b.check(ctx, "etcd", s.Ping)
	case "zk":
		c, err := b.openZK(ctx, u)
		if err != nil {
			return nil, err
		}
		var opts []zklock.StoreOption
		if u.username != "" {
			opts = append(opts, zklock.WithStoreACL(userACL()...))
		}
		s, err := zklock.NewStore(c, opts...)
		if err != nil {
			return nil, err
		}
		// The client connects in the background: only a request tells
		// whether the ensemble is there.
		return s, b.check(ctx, "zk", s.Ping)
	case "consul":
		c, err := b.openConsul(u.Hosts[0])
		if err != nil {
			return nil, err
		}
		s, err := consullock.NewStore(c)
		if err != nil {
			return nil, err
		}
		// The Store's session holds its claims: closing it deletes them
		// at once rather than when the session's TTL runs out.
		b.closers = append(b.closers, func() { s.Close() })
		// The client makes no request until asked.
		return s, b.check(ctx, "consul", s.Ping)
	}
	return nil, fmt.Errorf("%s: %w", u, ErrNoStore)
}

// quietZK drops the ZooKeeper client's log of every connection attempt: a
// server that cannot be reached is reported once, by the first request,
// as one error rather than a line per retry.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

package backendurl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/warden-go/warden/backends/consullock"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in     string
		scheme string
		hosts  int
	}{
		{"memory", "memory", 0},
		{"sqlite:///tmp/x.db", "sqlite", 0},
		{"sqlite://file:/tmp/x.db?_pragma=foreign_keys(1)&_pragma=synchronous(1)", "sqlite", 0},
		{"postgres://u:p@127.0.0.1:5432/db?sslmode=disable", "postgres", 0},
		{"postgresql://127.0.0.1/db", "postgres", 0},
		{"postgres://u:p@127.0.0.1:5432/db%40x", "postgres", 0},
		{"mysql://u:p@tcp(127.0.0.1:3306)/db", "mysql", 0},
		{"mysql://u:p@tcp(127.0.0.1:3306)/db?autocommit=1", "mysql", 0},
		{"redis://127.0.0.1:6379", "redis", 1},
		{"redlock://a:1,b:2,c:3", "redlock", 3},
		{"etcd://a:1,b:2", "etcd", 2},
		{"zk://a:1", "zk", 1},
		{"consul://127.0.0.1:8500", "consul", 1},
		{"etcd://a:1,b:2/", "etcd", 2},
		{"zk://a:1/", "zk", 1},
		{"consul://127.0.0.1:8500/", "consul", 1},
	} {
		u, err := Parse(tc.in)
		if err != nil || u.Scheme != tc.scheme || len(u.Hosts) != tc.hosts {
			t.Errorf("Parse(%q) = %+v, %v; want scheme %s with %d hosts", tc.in, u, err, tc.scheme, tc.hosts)
		}
	}
	for in, want := range map[string]string{
		"redis":                                                      "not a backend URL",
		"127.0.0.1:6379":                                             "SCHEME one of sqlite, postgres (or postgresql), mysql, redis, rediss, redlock, redlocks, etcd, zk, consul",
		"sqlite://":                                                  "no file path",
		"sqlite://u:secret@/tmp/x.db":                                "no user info",
		"redis://127.0.0.1:1?dial_timeout=-1s":                       "dial_timeout is negative",
		"redlock://a:1,b:2,c:3?pool_timeout=-2s":                     "pool_timeout is negative",
		"mysql://u:p@tcp(h:1)/db?timeout=-1s":                        "timeout is negative",
		"mysql://u:p@tcp(h:1)/db?readTimeout=-5ms":                   "readTimeout is negative",
		"mysql://u:p@tcp(h:1)/db?writeTimeout=-1s":                   "writeTimeout is negative",
		"redis://127.0.0.1:1/0?db=1&db=2":                            `option "db" given twice`,
		"redlock://a:1,b:2,c:3?dial_timeout=1s&dial_timeout=9s":      `option "dial_timeout" given twice`,
		"postgres://h:1/db?sslmode=require&sslmode=disable":          `option "sslmode" given twice`,
		"mysql://u:p@tcp(h:1)/db?tls=true&tls=false":                 `option "tls" given twice`,
		"mysql://u:p@tcp(h:1)/db?autocommit=0":                       "autocommit=0: the statements would stay uncommitted",
		"mysql://u:p@tcp(h:1)/db?AUTOCOMMIT=OFF":                     "AUTOCOMMIT=OFF: the statements would stay uncommitted",
		"sqlite://file:/tmp/x.db?mode=rwc&mode=memory&cache=shared":  `option "mode" given twice`,
		"sqlite://file:/tmp/x.db?mode=memory&mo%64e=rwc":             `option "mode" given twice`,
		"postgres://h:1/db?password=secret&password=secret2&x=1&x=2": `option "password" given twice`,
		"postgres://h:1/db?sslmode=require& sslmode=disable":         `option "sslmode" given twice`,
		"postgres://h:1/db?sslmode=require&sslmode =disable":         `option "sslmode" given twice`,
		"postgres://h:1/db?ssl=true&sslmode=disable":                 `option "sslmode" given twice`,
		"postgres://h:1/db?dbname=a&database=b":                      `option "dbname" given twice`,
		"redis://127.0.0.1:1/0?db=1&%20db=2":                         `option "db" given twice`,
		"sqlite://u:s?ecret@/x.db":                                   "no user info",
		"mysql://u@127.0.0.1/db":                                     "want mysql://",
		"redis://a:1,b:2":                                            "one host:port",
		"redlock://a:1,b:2":                                          "odd number of nodes",
		"etcd://nohost":                                              "is not host:port",
		"consul://a:1,b:2":                                           "one host:port",
		"ftp://x":                                                    "unknown scheme",
		"http://127.0.0.1:8500":                                      "want one of sqlite, postgres (or postgresql), mysql, redis, rediss, redlock, redlocks, etcd, zk, consul, or memory",
		"postgres://u:secret@[::1/db":                                "postgres://xxxxx:",
	} {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q): %v, want an error naming %q", in, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q) shows the password: %v", in, err)
		}
	}
}

// TestSeveralHostsWithIPv6: a list of hosts may hold IPv6 literals, as
// one host may; each is a host:port of Hosts, and of a RedLock master.
func TestSeveralHostsWithIPv6(t *testing.T) {
	for in, want := range map[string][]string{
		"redlock://[::1]:1,[::1]:2,[::1]:3":             {"[::1]:1", "[::1]:2", "[::1]:3"},
		"redlocks://u:pw@127.0.0.1:1,[::1]:2,[::1]:3/2": {"127.0.0.1:1", "[::1]:2", "[::1]:3"},
		"etcd://root:pw@127.0.0.1:1,[::1]:2":            {"127.0.0.1:1", "[::1]:2"},
		"zk://[::1]:1,[fe80::1%25eth0]:2":               {"[::1]:1", "[fe80::1%eth0]:2"},
		"redlock://[fe80::1%25lo]:1,[::1]:2,[::1]:3":    {"[fe80::1%lo]:1", "[::1]:2", "[::1]:3"},
		"etcd://[2001:db8::1]:2379,[2001:db8::2]:2379":  {"[2001:db8::1]:2379", "[2001:db8::2]:2379"},
	} {
		u, err := Parse(in)
		if err != nil || !slices.Equal(u.Hosts, want) {
			t.Errorf("Parse(%q): %v, %v; want hosts %q", in, u, err, want)
			continue
		}
		for i, o := range u.redis {
			if o.Addr != want[i] || o.DB != map[bool]int{true: 2}[strings.HasSuffix(in, "/2")] {
				t.Errorf("Parse(%q): master %d at %s, db %d", in, i, o.Addr, o.DB)
			}
		}
		if strings.Contains(u.String(), "pw") {
			t.Errorf("Parse(%q) prints as %s", in, u)
		}
	}
	for in, want := range map[string]string{
		"postgres://u:pw@[::1]:1,[::1]:2/db": "postgres://xxxxx@[::1]:1,[::1]:2/db",
		"redis://[::1]:1,[::1]:2":            "one host:port",
		"consul://[::1]:1,[::1]:2":           "one host:port",
		"etcd://[::1]:1,[::1]":               `"[::1]" is not host:port`,
		"etcd://[::1]:1,[::1]:2/x":           "hosts only",
		"etcd://[fe80::1%25lo]:1,[::1]:2":    "takes no IPv6 zone",
		"consul://[fe80::1%25lo]:8500":       "takes no IPv6 zone",
		"zk://[::1]:1,[::1:2":                "not a valid URL",
		"redlock://h1:1,,h3:3":               "an empty host in the list",
		"etcd://u:p@h1:1,h2:2,":              "an empty host in the list",
	} {
		u, err := Parse(in)
		got := fmt.Sprint(err)
		if err == nil {
			got = u.String()
		}
		if !strings.Contains(got, want) {
			t.Errorf("Parse(%q): %v, %v; want %q", in, u, err, want)
		}
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	o := NewOpener()
	defer o.Close()
	mem, _ := Parse("memory")
	if _, err := o.Locker(ctx, mem, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Store(ctx, mem); err != nil {
		t.Fatal(err)
	}
	rl, _ := Parse("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
	if _, err := o.Store(ctx, rl); !errors.Is(err, ErrNoStore) {
		t.Fatalf("Store on redlock: %v, want ErrNoStore", err)
	}
	u, err := Parse("redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Locker(ctx, u, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Store(ctx, u); err != nil {
		t.Fatal(err)
	}
	for _, ping := range o.Pings() {
		if err := ping.Check(ctx); err != nil || ping.Backend == "" {
			t.Fatalf("ping %q: %v", ping.Backend, err)
		}
	}
}

// TestOpenConsul: consul:// opens a Locker and an idempotency store on the
// agent, which answer, and share one client.
func TestOpenConsul(t *testing.T) {
	ctx := context.Background()
	o := NewOpener()
	defer o.Close()
	u, err := Parse("consul://" + drivertest.Addr(t, "WARDEN_CONSUL_ADDR", "127.0.0.1:18500"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := o.Locker(ctx, u, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if lim := driver.LimitsOf(l); lim.MinTTL != 10*time.Second {
		t.Fatalf("consul Locker limits %+v, want Consul's 10 s minimum session TTL", lim)
	}
	s, err := o.Store(ctx, u)
	if err != nil {
		t.Fatalf("Store on consul: %v", err)
	}
	if _, ok := s.(*consullock.Store); !ok {
		t.Fatalf("Store on consul is a %T", s)
	}
	if len(o.consul) != 1 {
		t.Errorf("%d consul clients for one agent", len(o.consul))
	}
	k := fmt.Sprint("backendurl-", time.Now().UnixNano())
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "o", Lease: time.Minute}); rec != nil || err != nil {
		t.Fatalf("Claim on the consul store: (%v, %v)", rec, err)
	}
	if err := s.Complete(ctx, "", k, "o", []byte("done"), time.Minute); err != nil {
		t.Fatalf("Complete on the consul store: %v", err)
	}
	if err := s.(idempotency.Deleter).Delete(ctx, "", k, ""); err != nil {
		t.Fatalf("Delete on the consul store: %v", err)
	}
	if len(o.Pings()) != 2 {
		t.Errorf("%d pings, want the Locker's and the Store's", len(o.Pings()))
	}
	for _, ping := range o.Pings() {
		if err := ping.Check(ctx); err != nil {
			t.Fatalf("ping: %v", err)
		}
	}
}

// TestEtcdFirstEndpointDown: an etcd URL lists the cluster's members so
// that one of them may be down; the first being the one down, the store
// opens on the others, and its health check passes.
func TestEtcdFirstEndpointDown(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	u, err := Parse("etcd://" + down + "," + drivertest.Addr(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379"))
	if err != nil {
		t.Fatal(err)
	}
	o := NewOpener()
	defer o.Close()
	if _, err := o.Store(ctx, u); err != nil {
		t.Fatalf("Store with the first endpoint down: %v", err)
	}
	for _, ping := range o.Pings() {
		if err := ping.Check(ctx); err != nil {
			t.Errorf("ping %s: %v", ping.Backend, err)
		}
	}
}

// TestMySQLPasswordWithQuestionMark: a MySQL password may hold a '?' (the
// driver takes the password as it is written): parseTime joins the DSN's
// own parameters, or starts them after the database name, and never
// lands in the database name.
func TestMySQLPasswordWithQuestionMark(t *testing.T) {
	for _, s := range []string{
		"mysql://u:p?w@tcp(127.0.0.1:1)/warden",
		"mysql://u:p?w@tcp(127.0.0.1:1)/warden?timeout=1s",
		"mysql://u:p?parseTime=false@tcp(127.0.0.1:1)/warden",
	} {
		u, err := Parse(s)
		if err != nil {
			t.Errorf("Parse(%s): %v", Redact(s), err)
			continue
		}
		cfg, err := mysql.ParseDSN(u.DSN)
		if err != nil || cfg.DBName != "warden" || !cfg.ParseTime || !strings.HasPrefix(cfg.Passwd, "p?") {
			t.Errorf("Parse(%s): the driver reads the database %q, parseTime %t (%v); want warden, true and the password", Redact(s), cfg.DBName, cfg.ParseTime, err)
		}
	}
}

// TestRedLockWithAMasterDown: a RedLock needs a majority of its masters,
// not every one: with one of three down, the Locker opens, locks, and its
// health check passes.
func TestRedLockWithAMasterDown(t *testing.T) {
	ctx := context.Background()
	addrs := strings.Split(envOr("WARDEN_REDLOCK_ADDRS", "127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382"), ",")
	if len(addrs) < 2 {
		t.Fatalf("WARDEN_REDLOCK_ADDRS %q: want two masters at least", addrs)
	}
	u, err := Parse("redlock://" + addrs[0] + "," + addrs[1] + "," + drivertest.ClosedAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	o := NewOpener()
	defer o.Close()
	l, err := o.Locker(ctx, u, 10*time.Second)
	if err != nil {
		t.Fatalf("RedLock with one master of three down: %v", err)
	}
	lease, err := l.Acquire(ctx, fmt.Sprint("backendurl-redlock-", time.Now().UnixNano()), driver.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("lock on two masters of three: %v", err)
	}
	defer lease.Release(ctx)
	for _, ping := range o.Pings() {
		if err := ping.Check(ctx); err != nil {
			t.Errorf("ping %s: %v", ping.Backend, err)
		}
	}
}

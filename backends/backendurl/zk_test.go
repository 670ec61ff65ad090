package backendurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// zkPassword has the characters a URL must percent-encode.
const zkPassword = "p@ss/w:rd%42"

// TestZKCredentialsParsed: zk://user:password@hosts gives a digest user's
// credentials, percent-decoded, and prints without them; a user without a
// password or with an empty one, or whose name has a ':' (ZooKeeper would
// read the password from there), is refused, and so are a path (a chroot)
// and query parameters, each for what it is.
func TestZKCredentialsParsed(t *testing.T) {
	in := "zk://alice:" + url.QueryEscape(zkPassword) + "@127.0.0.1:1,[::1]:2"
	u, err := Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	if u.username != "alice" || u.password != zkPassword || len(u.Hosts) != 2 {
		t.Errorf("Parse(%q): user %q, password %q, hosts %q", in, u.username, u.password, u.Hosts)
	}
	if got := u.String(); got != "zk://xxxxx@127.0.0.1:1,[::1]:2" {
		t.Errorf("Parse(%q) prints as %s", in, got)
	}
	for in, want := range map[string]string{
		"zk://alice@127.0.0.1:1":                "user:password",
		"zk://alice:@127.0.0.1:1":               "user:password",
		"zk://:pw@127.0.0.1:1":                  "user:password",
		"zk://al%3Aice:s3cretpw@127.0.0.1:1":    "no ':'",
		"zk://alice:s3cretpw@127.0.0.1:1/app":   "chroot",
		"zk://alice:s3cretpw@127.0.0.1:1?x=1":   "no query parameters",
		"zk://alice:s3cretpw@127.0.0.1:1/?x=1":  "no query parameters",
		"zk://alice:s3cretpw@127.0.0.1:1/a?x=1": "chroot",
	} {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Parse(%q): %v, want an error saying %q without the password", in, err, want)
		}
	}
}

// sharedRoots makes the roots, and the store's buckets, which the first
// user to need them makes with its own ACL: made with the world's, they
// stay open to the tests that run without credentials, or as another user.
func sharedRoots(t *testing.T, anon *zk.Conn) {
	t.Helper()
	shared := []string{"/warden", "/warden/locks", "/warden/idem"}
	for i := range 256 {
		shared = append(shared, fmt.Sprintf("/warden/idem/%02x", i))
	}
	for _, p := range shared {
		if _, err := anon.Create(p, nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
}

// TestZKCredentials opens a Locker and a Store from a zk:// URL with a
// digest user's credentials on the test server: their nodes are that
// user's alone, which a connection without the credentials may not read,
// and a Locker with a wrong password is refused a lock whose nodes they
// are, with an error that does not show the password. So it goes with a
// password the server hashes otherwise than the client would: not UTF-8,
// which the server decodes with its charset, so that the bytes it hashes
// are not the URL's.
func TestZKCredentials(t *testing.T) {
	for name, password := range map[string]string{"url characters": url.QueryEscape(zkPassword), "not UTF-8": "p%FFw%FE"} {
		t.Run(name, func(t *testing.T) { testZKCredentials(t, password) })
	}
}

func testZKCredentials(t *testing.T, password string) {
	hosts := drivertest.Addr(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	anon, _, err := zk.Connect(strings.Split(hosts, ","), 10*time.Second, zk.WithLogger(quietZK{}))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	sharedRoots(t, anon)

	u, err := Parse("zk://alice:" + password + "@" + hosts)
	if err != nil {
		t.Fatal(err)
	}
	o := NewOpener()
	defer o.Close()
	l, err := o.Locker(ctx, u, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("zk-credentials/%d", time.Now().UnixNano())
	held, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatalf("Acquire with the URL's credentials: %v", err)
	}
	defer held.Release(ctx)
	if _, _, err := anon.Children("/warden/locks/" + strings.ReplaceAll(key, "/", "%2F")); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("listing the lock's queue without credentials: %v, want zk.ErrNoAuth", err)
	}

	wrong, err := Parse("zk://alice:wr0ng-pa55@" + hosts)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := o.Locker(ctx, wrong, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if lease, err := lw.Acquire(ctx, key, driver.AcquireOptions{TTL: 2 * time.Second}); !errors.Is(err, zk.ErrNoAuth) || strings.Contains(err.Error(), "wr0ng") {
		if lease != nil {
			lease.Release(ctx)
		}
		t.Errorf("Acquire with a wrong password: %v, want zk.ErrNoAuth without the password", err)
	}

	s, err := o.Store(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: key, Owner: "o", Lease: time.Minute}); err != nil || rec != nil {
		t.Fatalf("Claim with the URL's credentials: %v, %v", rec, err)
	}
	if rec, err := s.Get(ctx, "", key); err != nil || rec == nil {
		t.Fatalf("Get with the URL's credentials: %v, %v", rec, err)
	}
	plain, err := Parse("zk://" + hosts)
	if err != nil {
		t.Fatal(err)
	}
	po := NewOpener()
	defer po.Close()
	so, err := po.Store(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := so.Get(ctx, "", key); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("Get without credentials: %v, want zk.ErrNoAuth", err)
	}
	if err := s.Abandon(ctx, "", key, "o"); err != nil {
		t.Errorf("Abandon with the URL's credentials: %v", err)
	}
}

package zklock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestACLRefusalFailsAtOnce: a waiting Acquire that ZooKeeper refuses for
// want of rights (a root under a node the Locker may not write, or under
// one with a digest ACL the session has no credentials for, a queue it may
// not list) fails at once, with an error that says so, rather than
// retrying the same refused request until its context ends. (An ACL of
// the Locker's own that its session could not use, New refuses.)
func TestACLRefusalFailsAtOnce(t *testing.T) {
	srv := servers(t)
	admin := connect(t, srv)
	base := fmt.Sprintf("/warden-test/acl-%d", time.Now().UnixNano())
	for _, p := range []string{"/warden-test", base} {
		if _, err := admin.Create(p, nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	if _, err := admin.Create(base+"/readonly", nil, zk.FlagPersistent, zk.WorldACL(zk.PermRead)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Create(base+"/digest", nil, zk.FlagPersistent, zk.DigestACL(zk.PermAll, "user", "secret")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(admin, base) })

	noRead := zk.WorldACL(zk.PermCreate | zk.PermWrite | zk.PermDelete)
	cases := []struct {
		name    string
		opts    []Option
		holder  bool // another contender holds the lock first
		refusal error
	}{
		{"root under a read-only node", []Option{WithRoot(base + "/readonly/locks")}, false, zk.ErrNoAuth},
		{"root under a digest ACL without credentials", []Option{WithRoot(base + "/digest/locks")}, false, zk.ErrNoAuth},
		{"queue it may not list", []Option{WithRoot(base + "/noread"), WithACL(noRead...)}, true, zk.ErrNoAuth},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := dial(t, srv, tc.opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.holder {
				held, err := dial(t, srv, tc.opts...).Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession})
				if err != nil {
					t.Fatalf("holder: %v", err)
				}
				defer held.Release(context.Background())
			}
			lease, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession, Wait: true})
			if err == nil {
				lease.Release(ctx)
				t.Fatal("acquired a lock ZooKeeper refuses")
			}
			if ctx.Err() != nil {
				t.Fatalf("the refused Acquire waited until its context ended: %v", err)
			}
			if !errors.Is(err, driver.ErrUnavailable) || !errors.Is(err, tc.refusal) || !errors.Is(err, errDenied) {
				t.Fatalf("error %v, want one wrapping driver.ErrUnavailable, %v and errDenied", err, tc.refusal)
			}
		})
	}
}

// TestUnreadableLeaseSendsNoWatchLoop: a lease whose node the Locker's ACL
// does not let it read goes without its revocation watch, rather than
// sending the refused read again and again for as long as it is held.
func TestUnreadableLeaseSendsNoWatchLoop(t *testing.T) {
	srv := servers(t)
	root := fmt.Sprintf("/warden-test/acl-%d/noread", time.Now().UnixNano())
	l := dial(t, srv, WithRoot(root), WithACL(zk.WorldACL(zk.PermCreate|zk.PermWrite|zk.PermDelete)...))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	// Without read, the watch's read is refused; retried, it would stay
	// under way for as long as the lease is held.
	eventually(t, "the refused watch is given up", func() bool { return l.watching.Load() == 0 })
	if _, _, err := l.conn.Get(held.(*lease).node); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("read of the lease's node: %v, want zk.ErrNoAuth", err)
	}
}

// TestNewRefusesACLWithoutDelete: an ACL that grants an identity create
// but whose entries matching that identity grant no delete is refused by
// New, naming the identity (a digest entry's by its user, without the
// hash of its password): the Locker would make nodes it could not delete,
// its locks granted but never released while its session lived.
// ZooKeeper combines the entries matching an identity, so create and delete
// granted by two entries are taken, as are entries whose match New cannot
// judge (ip ranges, "auth").
func TestNewRefusesACLWithoutDelete(t *testing.T) {
	digest := func(perms int32, user string) zk.ACL { return zk.DigestACL(perms, user, "secret")[0] }
	world := func(perms int32) zk.ACL { return zk.WorldACL(perms)[0] }
	ip := func(perms int32, id string) zk.ACL { return zk.ACL{Perms: perms, Scheme: "ip", ID: id} }
	for _, tc := range []struct {
		acl  []zk.ACL
		name string // the identity the error names
	}{
		{[]zk.ACL{world(zk.PermRead | zk.PermCreate | zk.PermWrite | zk.PermAdmin)}, "world:anyone"},
		{[]zk.ACL{world(zk.PermCreate)}, "world:anyone"},
		{[]zk.ACL{digest(zk.PermAll, "user"), world(zk.PermRead | zk.PermCreate)}, "world:anyone"},
		{[]zk.ACL{digest(zk.PermCreate|zk.PermRead, "user"), digest(zk.PermDelete, "other")}, `digest user "user"`},
		{[]zk.ACL{ip(zk.PermCreate, "10.1.2.3"), digest(zk.PermDelete, "user")}, "ip:10.1.2.3"},
		// Two addresses, or ranges, that share none match no client in
		// common: a lock taken from one could never be released.
		{[]zk.ACL{ip(zk.PermCreate|zk.PermRead, "127.0.0.1"), ip(zk.PermDelete, "10.9.9.9")}, "ip:127.0.0.1"},
		{[]zk.ACL{ip(zk.PermCreate, "10.1.2.3"), ip(zk.PermDelete, "192.168.0.0/16")}, "ip:10.1.2.3"},
	} {
		l, err := New([]string{"127.0.0.1:1"}, WithACL(tc.acl...), WithLogger(discard{}))
		if err == nil {
			l.Close()
			t.Errorf("New with ACL %v succeeded", tc.acl)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), tc.name+" is granted create without delete") {
			t.Errorf("New with ACL %v: %v, want ErrInvalidOption naming %s and delete", tc.acl, err, tc.name)
		}
		if hash := shownHash(err, tc.acl); hash != "" {
			t.Errorf("New with ACL %v: %v shows the digest hash %s", tc.acl, err, hash)
		}
	}
	for _, acl := range [][]zk.ACL{
		{world(zk.PermAll)},
		{world(zk.PermCreate | zk.PermDelete)},
		{digest(zk.PermAll, "user"), world(zk.PermRead)},
		{world(zk.PermCreate | zk.PermRead), world(zk.PermDelete)},
		{digest(zk.PermCreate|zk.PermRead, "user"), world(zk.PermDelete)},
		{digest(zk.PermCreate, "user"), digest(zk.PermDelete, "user")},
		{ip(zk.PermCreate, "10.1.2.3"), ip(zk.PermDelete, "10.0.0.0/8")},
		{ip(zk.PermCreate, "10.0.0.0/8"), ip(zk.PermDelete, "10.1.0.0/16")},
		{ip(zk.PermCreate, "10.1.2.3"), ip(zk.PermDelete, "not-an-address")},
		{zk.AuthACL(zk.PermCreate)[0], digest(zk.PermDelete, "user")},
	} {
		// With the digest user's credentials, which a Locker needs to use
		// an ACL of that user's (see TestNewJudgesACLWithCredentials).
		l, err := New([]string{"127.0.0.1:1"}, WithACL(acl...), WithAuth("digest", []byte("user:secret")), WithLogger(discard{}))
		if err != nil {
			t.Errorf("New with ACL %v: %v", acl, err)
			continue
		}
		l.Close()
	}
}

// shownHash returns the hash of a digest entry of acl that err shows, or
// "".
func shownHash(err error, acl []zk.ACL) string {
	for _, e := range acl {
		if _, hash, _ := strings.Cut(e.ID, ":"); e.Scheme == "digest" && strings.Contains(err.Error(), hash) {
			return hash
		}
	}
	return ""
}

// TestSplitGrantsRelease: with create and delete granted to world:anyone by
// two entries, which New takes, the Locker acquires and releases, and its
// release deletes the node.
func TestSplitGrantsRelease(t *testing.T) {
	s := startServer(t)
	srv := []string{s.addr}
	acl := []zk.ACL{{Perms: zk.PermCreate | zk.PermRead, Scheme: "world", ID: "anyone"}, {Perms: zk.PermDelete, Scheme: "world", ID: "anyone"}}
	l := dial(t, srv, WithACL(acl...))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A JVM just started may turn the first connection away.
	eventually(t, "the server answers", func() bool { return l.Ping(ctx) == nil })
	k := testKey(t)
	admin := connect(t, srv)
	for i := range 2 {
		held, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
		if ok, _, err := admin.Exists(held.(*lease).node); err != nil || ok {
			t.Fatalf("node of released lease %d: exists %v, %v", i, ok, err)
		}
	}
}

// TestRefusedDeleteRetriedSlowly: a delete that the ACL of the node's
// parent refuses (another client set it) is tried again once per session
// timeout, not in a tight loop, and logged once; once another client
// restores the ACL, the next try deletes the node, which frees the lock
// while the Locker is still open, and that is logged too.
func TestRefusedDeleteRetriedSlowly(t *testing.T) {
	s := startServer(t)
	srv := []string{s.addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log recorder
	l := dial(t, srv, WithLogger(&log))
	// A JVM just started may turn the first connection away.
	eventually(t, "the server answers", func() bool { return l.Ping(ctx) == nil })
	k := testKey(t)
	held, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	admin := connect(t, srv)
	if _, err := admin.SetACL(l.lockPath(k), zk.WorldACL(zk.PermAll&^zk.PermDelete), -1); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); !errors.Is(err, errDenied) || !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("Release: %v, want errDenied wrapping zk.ErrNoAuth", err)
	}
	eventually(t, "the refused delete is logged", func() bool { return log.count() == 1 })

	// Over three session timeouts, the retry sends a delete per session
	// timeout: three, two to four with the timers' slack (a tight loop
	// sends one every 20-200 ms).
	sent, window := l.requests.Load(), 3*l.sessionTimeout()
	time.Sleep(window)
	if n := l.requests.Load() - sent; n < 2 || n > 4 || log.count() != 1 {
		t.Fatalf("%d requests and %d log lines in %v after the refused delete, want 2 to 4 and one", n, log.count(), window)
	}
	node := held.(*lease).node
	if ok, _, err := admin.Exists(node); err != nil || !ok {
		t.Fatalf("the refused Release's node %s: exists %v, %v; want it kept", node, ok, err)
	}

	// Another Locker's contender, which loses and whose delete is refused
	// too, returns on the refusal rather than wait for the delete until
	// its context or a session timeout ends.
	other := dial(t, srv, WithSessionTimeout(40*time.Second))
	short, cancelShort := context.WithTimeout(ctx, 10*time.Second)
	defer cancelShort()
	if _, err := other.Acquire(short, k, driver.AcquireOptions{TTL: testSession}); !errors.Is(err, driver.ErrNotAcquired) || short.Err() != nil {
		t.Fatalf("Acquire while the refused Release's node stays: %v (context: %v), want ErrNotAcquired before the context ends", err, short.Err())
	}
	// Its node goes with its session (its refused delete is tried again
	// only every 40 s).
	other.Close()

	if _, err := admin.SetACL(l.lockPath(k), zk.WorldACL(zk.PermAll), -1); err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	eventually(t, "the retried delete succeeds and is logged", func() bool { return log.count() == 2 })
	t.Logf("the lock was freed %v after the ACL was restored", time.Since(restored))
	got, err := dial(t, srv).Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatalf("Acquire once the ACL was restored, the first Locker still open: %v", err)
	}
	got.Release(ctx)
}

// recorder is a zk.Logger that counts the Locker's own lines (the client
// library's are not counted).
type recorder struct{ n atomic.Int64 }

func (r *recorder) Printf(format string, args ...any) {
	if strings.HasPrefix(fmt.Sprintf(format, args...), "zklock: ") {
		r.n.Add(1)
	}
}

func (r *recorder) count() int64 { return r.n.Load() }

// TestRefusedSweepRetriedSlowly: the search for a node that a create whose
// answer was lost may have made, which lists the queue, is refused when the
// ACL grants no read (which WithACL allows): it is tried again once per
// session timeout (see TestRefusedDeleteRetriedSlowly), not in a tight loop,
// and the refusal is logged once.
func TestRefusedSweepRetriedSlowly(t *testing.T) {
	s := startServer(t)
	p := drivertest.StartProxy(t, s.addr)
	noRead := WithACL(zk.WorldACL(zk.PermCreate | zk.PermWrite | zk.PermDelete)...)
	var log recorder
	l := dial(t, []string{p.Addr()}, WithLogger(&log), noRead)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A JVM just started may turn the first connection away.
	eventually(t, "the server answers", func() bool { return l.Ping(ctx) == nil })
	k := testKey(t)
	// A holder keeps the queue's parent, which the create then finds.
	held, err := dial(t, []string{s.addr}, noRead).Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	p.LoseReplies()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = l.Acquire(short, k, driver.AcquireOptions{TTL: testSession})
	cancelShort()
	if err == nil {
		t.Fatal("acquired with the server's answers lost")
	}
	// The connection's reset fails the create as lost: the Locker looks
	// for its node, over a new connection, and is refused the listing.
	p.Reset()
	eventually(t, "the refused listing is logged", func() bool { return log.count() == 1 })
	if _, _, err := connect(t, []string{s.addr}).Children(l.lockPath(k)); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("listing of the queue: %v, want zk.ErrNoAuth", err)
	}
	// One listing per session timeout: three in three, two to four with
	// the timers' slack (a tight loop sends one every 20-200 ms).
	sent, window := l.requests.Load(), 3*l.sessionTimeout()
	time.Sleep(window)
	if n := l.requests.Load() - sent; n < 2 || n > 4 || log.count() != 1 {
		t.Fatalf("%d requests and %d log lines in %v after the refused listing, want 2 to 4 and one", n, log.count(), window)
	}
}

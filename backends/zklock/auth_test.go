package zklock

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// The credentials of the tests' digest user: a password with the
// characters a URL or a log line would mangle.
const (
	authUser     = "alice"
	authPassword = "p@ss/w:rd%42"
	wrongPass    = "wr0ng-pa55"
)

func digestAuth(password string) Option {
	return WithAuth("digest", []byte(authUser+":"+password))
}

// sha256Digest is the hash of a digest ACL's id on a server whose digest
// provider uses SHA-256 (digestAlg).
func sha256Digest(userPassword string) string {
	sum := sha256.Sum256([]byte(userPassword))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// lines is a zk.Logger that keeps every line, the client library's too.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, fmt.Sprintf(format, args...))
}

// has reports whether a line contains s.
func (l *lines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.all, func(line string) bool { return strings.Contains(line, s) })
}

// showing returns the lines that show one of secrets.
func (l *lines) showing(secrets ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.all {
		for _, s := range secrets {
			if strings.Contains(line, s) {
				out = append(out, line)
			}
		}
	}
	return out
}

// secureRoot creates, on the servers srv, a node that only authUser may
// use (a digest ACL), under a parent of the test's own, and returns it
// with a connection that has authUser's credentials.
func secureRoot(t *testing.T, srv []string) (string, *zk.Conn) {
	t.Helper()
	admin := connect(t, srv)
	if err := admin.AddAuth("digest", []byte(authUser+":"+authPassword)); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("/warden-test/auth-%d", time.Now().UnixNano())
	for _, p := range []string{"/warden-test", base} {
		if _, err := admin.Create(p, nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	secure := base + "/secure"
	if _, err := admin.Create(secure, nil, zk.FlagPersistent, zk.DigestACL(zk.PermAll, authUser, authPassword)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(admin, base) })
	return secure, admin
}

// TestWithAuth: WithAuth refuses a scheme that names no provider and
// digest credentials that are not user:password with neither empty, says
// which, and quotes no credential in its error.
func TestWithAuth(t *testing.T) {
	for _, tc := range []struct {
		scheme, auth, why string
	}{
		{"", "s3cretpw", "scheme"},
		{"di gest", "s3cretpw", "scheme"},
		{"digest:x", "s3cretpw", "scheme"},
		{"digest", "s3cretpw", "no ':'"},
		{"digest", "s3cretpw:", "empty password"},
		{"digest", ":s3cretpw", "empty user"},
		{"digest", ":", "empty user"},
	} {
		l, err := New([]string{"127.0.0.1:1"}, WithAuth(tc.scheme, []byte(tc.auth)))
		if err == nil {
			l.Close()
			t.Errorf("WithAuth(%q, %q) taken", tc.scheme, tc.auth)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), tc.why) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("WithAuth(%q, ...): %v, want ErrInvalidOption saying %q, quoting no credential", tc.scheme, err, tc.why)
		}
	}
}

// TestNewJudgesACLWithCredentials: New refuses an ACL under which the
// Locker's session, with the credentials WithAuth gives it, could not
// create and delete its nodes (a digest ACL for a user it has no
// credentials of; zk.AuthACL without credentials, or with ip ones, which
// give no authenticated identity), naming the credentials
// and none of their secrets, and takes those it may use: a digest ACL of
// a credential's user is taken whatever its hash, which the server
// computes (SHA-256 with digestAlg).
func TestNewJudgesACLWithCredentials(t *testing.T) {
	alice := zk.DigestACL(zk.PermAll, authUser, authPassword)
	world := zk.WorldACL(zk.PermRead)
	for _, tc := range []struct {
		name    string
		opts    []Option
		mention string
	}{
		{"digest ACL without credentials", []Option{WithACL(alice...)}, "without credentials"},
		{"digest ACL with another user's credentials", []Option{WithAuth("digest", []byte("bob:"+wrongPass)), WithACL(alice...)}, `digest user "bob"`},
		{"digest ACL beside the world's create and delete", []Option{WithACL(alice[0], zk.WorldACL(zk.PermCreate | zk.PermDelete)[0], world[0])}, ""},
		{"auth ACL without credentials", []Option{WithACL(zk.AuthACL(zk.PermAll)...)}, "WithAuth"},
		// The ip provider gives no authenticated identity: the server
		// would refuse every node's ACL (zk.ErrInvalidACL).
		{"auth ACL with ip credentials", []Option{WithAuth("ip", []byte("127.0.0.1")), WithACL(zk.AuthACL(zk.PermAll)...)}, `scheme "ip"`},
		{"read only to the world", []Option{WithACL(append(world, zk.DigestACL(zk.PermAll, "bob", authPassword)...)...), digestAuth(authPassword)}, `digest user "alice"`},
	} {
		l, err := New([]string{"127.0.0.1:1"}, append(tc.opts, WithLogger(discard{}))...)
		if tc.mention == "" {
			// Taken: world grants create and delete.
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			} else {
				l.Close()
			}
			continue
		}
		if err == nil {
			l.Close()
			t.Errorf("%s: New took it", tc.name)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("%s: %v, want ErrInvalidOption naming %s", tc.name, err, tc.mention)
		}
		if msg := err.Error(); strings.Contains(msg, authPassword) || strings.Contains(msg, wrongPass) {
			t.Errorf("%s: %v shows a password", tc.name, err)
		}
	}
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"digest ACL with its user's credentials", []Option{WithACL(alice...), digestAuth(authPassword)}},
		{"auth ACL with credentials", []Option{WithACL(zk.AuthACL(zk.PermAll)...), digestAuth(authPassword)}},
		{"auth ACL with credentials of another scheme", []Option{WithACL(zk.AuthACL(zk.PermAll)...), WithAuth("custom", []byte("token"))}},
		{"digest ACL with several credentials", []Option{WithAuth("digest", []byte("bob:"+wrongPass)), digestAuth(authPassword), WithACL(alice...)}},
		// The server's hash, which the client does not compute alike: a
		// wrong password is found out at the first request.
		{"digest ACL with another hash of its user's", []Option{WithACL(zk.ACL{Perms: zk.PermAll, Scheme: "digest", ID: authUser + ":" + sha256Digest(authUser+":"+authPassword)}), digestAuth(authPassword)}},
		{"digest ACL with a wrong password", []Option{WithACL(alice...), digestAuth(wrongPass)}},
	} {
		l, err := New([]string{"127.0.0.1:1"}, append(tc.opts, WithLogger(discard{}))...)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		l.Close()
	}
}

// refusedAtOnce makes a waiting Acquire on l, which must fail before ctx
// ends, and returns its error.
func refusedAtOnce(ctx context.Context, t *testing.T, l *Locker) error {
	t.Helper()
	lease, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: testSession, Wait: true})
	if err == nil {
		lease.Release(ctx)
		t.Fatal("acquired on a session the ensemble refuses")
	}
	if ctx.Err() != nil {
		t.Fatalf("the refused Acquire waited until its context ended: %v", err)
	}
	return err
}

// TestServerHashedDigestACL: on a server whose digest provider uses
// SHA-256, a Locker locks and releases with a digest ACL of its user as
// the server hashes it, which New takes, and with zk.AuthACL; one with a
// wrong password, which New takes too, is refused at its first request.
func TestServerHashedDigestACL(t *testing.T) {
	srv := []string{startServer(t, "-Dzookeeper.DigestAuthenticationProvider.digestAlg=SHA-256").addr}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sha256ACL := zk.ACL{Perms: zk.PermAll, Scheme: "digest", ID: authUser + ":" + sha256Digest(authUser+":"+authPassword)}
	for name, acl := range map[string]zk.ACL{"sha256": sha256ACL, "auth": zk.AuthACL(zk.PermAll)[0]} {
		root := WithRoot("/" + name)
		l := dial(t, srv, root, digestAuth(authPassword), WithACL(acl))
		held, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession})
		if err != nil {
			t.Fatalf("%s ACL: Acquire: %v", name, err)
		}
		wrong := dial(t, srv, root, digestAuth(wrongPass), WithACL(acl))
		if err := refusedAtOnce(ctx, t, wrong); !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s ACL: Acquire with a wrong password: %v, want zk.ErrNoAuth", name, err)
		}
		if err := held.Release(ctx); err != nil {
			t.Errorf("%s ACL: Release: %v", name, err)
		}
	}
}

// TestDigestRoot: under a root only a digest user may use, a Locker with
// that user's credentials, and an ACL of that user's on its nodes, locks
// and releases; one without credentials, or with a wrong password, is
// refused at once, a waiting Acquire too, with an error that says so and
// names the credentials but not their password. No log line shows a
// password.
func TestDigestRoot(t *testing.T) {
	srv := servers(t)
	secure, admin := secureRoot(t, srv)
	root := WithRoot(secure + "/locks")
	log := &lines{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	l := dial(t, srv, root, digestAuth(authPassword), WithACL(zk.DigestACL(zk.PermAll, authUser, authPassword)...), WithLogger(log))
	other := dial(t, srv, root, digestAuth(authPassword), WithACL(zk.AuthACL(zk.PermAll)...), WithLogger(log))
	k := testKey(t)
	held, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatalf("Acquire with the root's user's credentials: %v", err)
	}
	if _, err := other.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("a second Acquire of a held lock: %v, want ErrNotAcquired", err)
	}
	node := held.(*lease).node
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if ok, _, err := admin.Exists(node); ok || err != nil {
		t.Fatalf("the released lease's node: exists %v, %v", ok, err)
	}
	again, err := other.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatalf("Acquire after the release: %v", err)
	}
	again.Release(ctx)

	for _, tc := range []struct {
		name    string
		opts    []Option
		mention string
	}{
		{"without credentials", nil, "refused by the ACL"},
		{"with a wrong password", []Option{digestAuth(wrongPass)}, `digest user "alice"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := refusedAtOnce(ctx, t, dial(t, srv, append(tc.opts, root, WithLogger(log))...))
			if !errors.Is(err, errDenied) || !errors.Is(err, zk.ErrNoAuth) || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("error %v, want one wrapping errDenied and zk.ErrNoAuth, naming %s", err, tc.mention)
			}
			if strings.Contains(err.Error(), wrongPass) || strings.Contains(err.Error(), authPassword) {
				t.Fatalf("error %v shows a password", err)
			}
		})
	}
	if shown := log.showing(authPassword, wrongPass); len(shown) > 0 {
		t.Errorf("log lines show a password: %q", shown)
	}
}

// TestRefusedCredentials: credentials the ensemble refuses (a scheme it
// has no provider for) fail the first call at once, a waiting Acquire's
// too, with an error that wraps zk.ErrAuthFailed and names the scheme but
// not the credential, and so do the calls after it; the Locker does not
// connect again, which would be refused again, forever: when the client
// library asks it for the next connection, which it logs, it makes none.
func TestRefusedCredentials(t *testing.T) {
	p := startCutProxy(t, servers(t)[0])
	log := &lines{}
	const secret = "s3cret-token"
	l := dial(t, []string{p.addr}, WithAuth("nosuchscheme", []byte(secret)), WithLogger(log))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := refusedAtOnce(ctx, t, l)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, zk.ErrAuthFailed) || !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), `"nosuchscheme"`) || strings.Contains(err.Error(), secret) {
			t.Errorf("%s: %v, want an error wrapping zk.ErrAuthFailed and driver.ErrInvalidOption, naming the scheme and not the credential", what, err)
		}
	}
	check("Acquire", err)
	check("Ping after", l.Ping(ctx))
	// The client library asks for a connection again as soon as the
	// refused one ends: the Locker logs that it makes none, and keeps the
	// library waiting until Close, so that the count is final once the
	// line is there.
	for !log.has("zklock: no further connection") {
		if n := p.accepted.Load(); n != 1 {
			t.Fatalf("%d connections, want 1: the Locker connected again after its credentials were refused", n)
		}
		if ctx.Err() != nil {
			t.Fatal("the Locker was not asked for a connection after the refusal, or did not say that it made none")
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.Close()
	if n := p.accepted.Load(); n != 1 {
		t.Fatalf("%d connections, want 1: the Locker connected again after its credentials were refused", n)
	}
	if shown := log.showing(secret); len(shown) > 0 {
		t.Errorf("log lines show the credential: %q", shown)
	}
}

// TestRefusedOnReconnect: a Locker holding a lease whose credentials the
// server refuses when it connects again (a server that lost their
// provider) declares the lease lost at once, as its session is not
// reached again, and its calls fail with the refusal.
func TestRefusedOnReconnect(t *testing.T) {
	srv := servers(t)
	secure, _ := secureRoot(t, srv)
	p := startCutProxy(t, srv[0])
	l := dial(t, []string{p.addr}, WithRoot(secure+"/locks"), digestAuth(authPassword), WithACL(zk.AuthACL(zk.PermAll)...),
		// A session that outlives the test: only the refusal ends the
		// lease.
		WithSessionTimeout(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, err := l.Acquire(ctx, testKey(t), driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p.refuseAuth.Store(true)
	p.kick()
	select {
	case <-sessionDone(held):
	case <-ctx.Done():
		t.Fatal("the lease was not declared lost after the credentials were refused")
	}
	if err := l.Ping(ctx); !errors.Is(err, zk.ErrAuthFailed) {
		t.Errorf("Ping after the refusal: %v, want zk.ErrAuthFailed", err)
	}
}

// TestCredentialsKeptOnReconnect: the credentials go with every
// connection of the Locker: after a restart of its server, the session
// taken up again releases a lease under a root only its user may use;
// after the server lost its data, the new session (started as after an
// expiry, see wipe.go) is granted a lock there. A connection of the
// caller's, to which AddAuth added them, has them after the restart too.
func TestCredentialsKeptOnReconnect(t *testing.T) {
	s := startServer(t)
	srv := []string{s.addr}
	secure, admin := secureRoot(t, srv)
	opts := []Option{WithRoot(secure + "/locks"), digestAuth(authPassword), WithACL(zk.AuthACL(zk.PermAll)...),
		// A session long enough for the holder to outlive a restart.
		WithSessionTimeout(40 * time.Second)}
	l := dial(t, srv, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	sid := l.conn.SessionID()

	s.restart(t, false)
	// Exists, which Ping sends, asks for no right: it says only that the
	// Locker is connected again.
	eventually(t, "the Locker is connected again", func() bool { return l.Ping(ctx) == nil })
	if got := l.conn.SessionID(); got != sid {
		t.Fatalf("session %#x after the restart, want %#x: the test needs the session kept", got, sid)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release on the session taken up again: %v", err)
	}
	// A connection of the caller's, as a Store or a Fence uses: the
	// client library sends the credentials AddAuth gave it again.
	eventually(t, "the caller's connection is back", func() bool {
		_, _, err := admin.Children(secure)
		if errors.Is(err, zk.ErrNoAuth) {
			t.Fatalf("listing %s on the caller's connection after the restart: %v", secure, err)
		}
		return err == nil
	})

	s.restart(t, true)
	// The server lost the root with its data: a connection of its own
	// makes it again.
	admin = connect(t, srv)
	if err := admin.AddAuth("digest", []byte(authUser+":"+authPassword)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/warden-test", secure[:strings.LastIndex(secure, "/")]} {
		if _, err := admin.Create(p, nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	if _, err := admin.Create(secure, nil, zk.FlagPersistent, zk.DigestACL(zk.PermAll, authUser, authPassword)); err != nil {
		t.Fatal(err)
	}
	next, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: testSession, Wait: true})
	if err != nil {
		t.Fatalf("Acquire on the new session: %v", err)
	}
	if got := l.conn.SessionID(); got == sid {
		t.Fatal("granted on the old session: the test needs a new one")
	}
	if err := next.Release(ctx); err != nil {
		t.Fatalf("Release on the new session: %v", err)
	}
}

// TestStoreAndFenceWithCredentials: a Store and a Fence on a connection
// the caller added credentials to work under a root only that user may
// use, with a digest ACL of that user's on their nodes; on a connection
// without them, they are refused.
func TestStoreAndFenceWithCredentials(t *testing.T) {
	srv := servers(t)
	secure, admin := secureRoot(t, srv)
	ctx := testCtx(t)
	acl := zk.DigestACL(zk.PermAll, authUser, authPassword)

	s, err := NewStore(admin, WithStoreRoot(secure+"/idem"), WithStoreACL(acl...))
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute}); err != nil || rec != nil {
		t.Fatalf("Claim: %v, %v", rec, err)
	}
	if err := s.Complete(ctx, "", "k", "o", []byte("done"), time.Minute); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if rec, err := s.Get(ctx, "", "k"); err != nil || rec == nil || string(rec.Response) != "done" {
		t.Fatalf("Get: %v, %v", rec, err)
	}
	f, err := NewFence(admin, WithFenceRoot(secure+"/fence"), WithFenceACL(acl))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Advance(ctx, fence.Claim{Resource: "r", Token: 7}); err != nil {
		t.Fatalf("Advance: %v", err)
	}
	if top, _, err := f.Highest(ctx, "r"); err != nil || top != 7 {
		t.Fatalf("Highest: %d, %v", top, err)
	}

	anon := connect(t, srv)
	if _, err := newTestStoreOn(t, anon, secure).Get(ctx, "", "k"); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("Get on a connection without credentials: %v, want zk.ErrNoAuth", err)
	}
	af, err := NewFence(anon, WithFenceRoot(secure+"/fence"))
	if err != nil {
		t.Fatal(err)
	}
	if err := af.Advance(ctx, fence.Claim{Resource: "r", Token: 8}); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("Advance on a connection without credentials: %v, want zk.ErrNoAuth", err)
	}
}

func newTestStoreOn(t *testing.T, conn *zk.Conn, secure string) *Store {
	t.Helper()
	s, err := NewStore(conn, WithStoreRoot(secure+"/idem"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreRefusedByACL: a Store whose records' ACL refuses its
// connection (one without their user's credentials), or whose own ACL the
// server will not set (zk.AuthACL on a connection without credentials),
// fails with the zk error wrapping idempotency.ErrInvalid, not
// ErrUnavailable, which an Executor would pass on as an outage (and
// httpmw's WithFailOpen serve keyed requests unguarded).
func TestStoreRefusedByACL(t *testing.T) {
	srv := servers(t)
	secure, admin := secureRoot(t, srv)
	ctx := testCtx(t)
	owners, err := NewStore(admin, WithStoreRoot(secure+"/idem"), WithStoreACL(zk.DigestACL(zk.PermAll, authUser, authPassword)...))
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := owners.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute}); err != nil || rec != nil {
		t.Fatalf("Claim with the credentials: %v, %v", rec, err)
	}
	anon := connect(t, srv)
	s := newTestStoreOn(t, anon, secure)
	_, claimErr := s.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o2", Lease: time.Minute})
	_, getErr := s.Get(ctx, "", "k")
	_, purgeErr := s.Purge(ctx)
	authACL, err := NewStore(anon, WithStoreRoot(secure[:strings.LastIndex(secure, "/")]+"/authacl"), WithStoreACL(zk.AuthACL(zk.PermAll)...))
	if err != nil {
		t.Fatal(err)
	}
	_, authACLErr := authACL.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute})
	for op, tc := range map[string]struct {
		err, want error
	}{
		"Claim":    {claimErr, zk.ErrNoAuth},
		"Get":      {getErr, zk.ErrNoAuth},
		"Purge":    {purgeErr, zk.ErrNoAuth},
		"Extend":   {s.Extend(ctx, "", "k", "o", time.Minute), zk.ErrNoAuth},
		"Complete": {s.Complete(ctx, "", "k", "o", []byte("r"), time.Minute), zk.ErrNoAuth},
		"Abandon":  {s.Abandon(ctx, "", "k", "o"), zk.ErrNoAuth},
		"Delete":   {s.Delete(ctx, "", "k", "o"), zk.ErrNoAuth},
		"Claim with an ACL the server will not set": {authACLErr, zk.ErrInvalidACL},
	} {
		if !errors.Is(tc.err, idempotency.ErrInvalid) || errors.Is(tc.err, driver.ErrUnavailable) || !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v; want ErrInvalid wrapping %v, not ErrUnavailable", op, tc.err, tc.want)
		}
	}
}

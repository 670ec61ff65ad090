package etcdlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// The users authEtcd creates: root, and a user whose password holds the
// characters a URL must escape, allowed to read and write only the keys
// from "ok" to "ol" (and perhaps the revocation markers) through the role
// lockRole.
const (
	rootPassword    = "rootpw"
	limitedUser     = "limited"
	limitedPassword = "p/@%:w?#"
	lockRole        = "locks"
)

// authEtcd starts a private etcd with authentication on, and limitedUser,
// allowed to read and write only the keys from "ok" to "ol" and, if
// markers is set, the revocation markers. It returns a client of that user.
func authEtcd(t *testing.T, markers bool) *clientv3.Client {
	t.Helper()
	return authClient(t, limitedUser, limitedPassword, authServer(t, markers))
}

// authClient returns a client of user on endpoints, closed at cleanup.
func authClient(t *testing.T, user, password string, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Username: user, Password: password, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// authServer is authEtcd's private etcd, set up as authEtcd says; it
// returns its endpoint.
func authServer(t *testing.T, markers bool) string {
	t.Helper()
	ep := privateEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root := newClient(t, []string{ep})
	user, password := limitedUser, limitedPassword
	steps := []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", rootPassword); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, lockRole); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, lockRole, "ok", "ol", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error {
			if !markers {
				return nil
			}
			_, err := root.RoleGrantPermission(ctx, lockRole, RevokedPrefix, clientv3.GetPrefixRangeEnd(RevokedPrefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, user, password); return err },
		func() error { _, err := root.UserGrantRole(ctx, user, lockRole); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	return ep
}

// TestRefusedForWantOfRights: a user without rights on a lock's keys gets
// etcd's refusal at once, waiting or not, and the session's other locks,
// on keys the user may write, are kept.
func TestRefusedForWantOfRights(t *testing.T) {
	l := lockerOn(t, authEtcd(t, true))
	ctx := context.Background()
	held, err := l.Acquire(ctx, "ok/held", opts(MinTTL, false))
	if err != nil {
		t.Fatalf("a lock the user may take: %v", err)
	}
	for _, wait := range []bool{false, true} {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		_, err := l.Acquire(wctx, "forbidden", opts(MinTTL, wait))
		cancel()
		t.Logf("wait=%v: %v after %v", wait, err, time.Since(start))
		if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, driver.ErrNotAcquired) {
			t.Errorf("wait=%v: got %v, want etcd's refusal", wait, err)
		}
		select {
		case <-held.(driver.SessionLease).Session().Done():
			t.Fatalf("wait=%v: the session holding another lock ended", wait)
		default:
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("release of the lock held meanwhile: %v", err)
	}
}

// TestMarkersRefused: a user who may take locks but not watch the
// revocation markers has every acquisition fail at once, waiting or not,
// with etcd's refusal naming RevokedPrefix, and its session revoked: its
// holders would never hear of a forced release, and the watch, refused
// again and again, was retried every 100 ms for the session's life.
func TestMarkersRefused(t *testing.T) {
	c := authEtcd(t, false)
	l := lockerOn(t, c)
	for _, wait := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := l.Acquire(ctx, "ok/lock", opts(MinTTL, wait))
		cancel()
		t.Logf("wait=%v: %v", wait, err)
		if !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), RevokedPrefix) {
			t.Errorf("wait=%v: got %v, want etcd's refusal to watch %s", wait, err, RevokedPrefix)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	leases, err := c.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Errorf("leases left: %v", leases.Leases)
	}
}

// TestMarkersRefusedLater: a session whose watch of the revocation markers
// etcd refuses once it has started (the user's rights on them withdrawn,
// and the watch made again on the other member the Locker moved to) is
// given up: its holder is told at once, before an operator's forced
// release could give the lock to another; a request on its lease names
// the refusal, and so does the next acquisition. The session lived on
// unwatched, and a forced release of its lock went unheard while the next
// holder held it.
func TestMarkersRefusedLater(t *testing.T) {
	ep := authServer(t, true)
	proxy := drivertest.StartProxy(t, ep)
	admin := authClient(t, "root", rootPassword, ep)
	l := lockerOn(t, authClient(t, limitedUser, limitedPassword, ep, proxy.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, err := l.Acquire(ctx, "ok/lock", opts(10*time.Second, false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RoleRevokePermission(ctx, lockRole, RevokedPrefix, clientv3.GetPrefixRangeEnd(RevokedPrefix)); err != nil {
		t.Fatal(err)
	}
	l.members.avoid(l.members.pick())
	select {
	case <-held.(driver.SessionLease).Session().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's session lives on with its revocation markers unwatched")
	}
	if err := held.Release(ctx); !errors.Is(err, driver.ErrNotHeld) || !strings.Contains(err.Error(), RevokedPrefix) {
		t.Errorf("release: got %v, want ErrNotHeld naming the refusal to watch %s", err, RevokedPrefix)
	}
	if _, err := l.Acquire(ctx, "ok/next", opts(10*time.Second, false)); !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), RevokedPrefix) {
		t.Errorf("next acquisition: got %v, want etcd's refusal to watch %s", err, RevokedPrefix)
	}
}

// TestPingWithRightsOnItsKeysAlone: a user with rights on its locks' keys
// alone, and none on the key a ping reads, has a cluster that answers
// pinged as answering, by a Locker and by a Store.
func TestPingWithRightsOnItsKeysAlone(t *testing.T) {
	c := authEtcd(t, true)
	s, err := NewStore(c, WithStorePrefix("ok"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for what, p := range map[string]driver.Pinger{"Locker": lockerOn(t, c), "Store": s} {
		if err := p.Ping(ctx); err != nil {
			t.Errorf("%s.Ping: %v", what, err)
		}
	}
}

// TestStoreRefusedForWantOfRights: a Store whose user may not read and
// write its prefix fails every call with etcd's refusal wrapping
// idempotency.ErrInvalid, not ErrUnavailable, which an Executor would
// pass on as an outage (and httpmw's WithFailOpen serve keyed requests
// unguarded); on a prefix the user may write, the same calls work.
func TestStoreRefusedForWantOfRights(t *testing.T) {
	c := authEtcd(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, prefix := range []string{"forbidden", "ok"} {
		s, err := NewStore(c, WithStorePrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		const owner = "owner-0123456789abcdef"
		claim := func(key string) error {
			_, err := s.Claim(ctx, idempotency.Claim{Key: key, Fingerprint: "f", Owner: owner, Lease: time.Minute})
			return err
		}
		_, getErr := s.Get(ctx, "", "done")
		got := map[string]error{
			"Claim": claim("done"), "Get": getErr,
			"Extend":   s.Extend(ctx, "", "done", owner, time.Minute),
			"Complete": s.Complete(ctx, "", "done", owner, []byte("r"), time.Minute),
			"Delete":   s.Delete(ctx, "", "done", owner),
			"Delete (any owner)": func() error {
				if err := claim("any"); prefix == "ok" && err != nil {
					return err
				}
				return s.Delete(ctx, "", "any", "")
			}(),
			"Abandon": func() error {
				if err := claim("abandoned"); prefix == "ok" && err != nil {
					return err
				}
				return s.Abandon(ctx, "", "abandoned", owner)
			}(),
		}
		for op, err := range got {
			switch {
			case prefix == "ok" && op == "Get":
				if !errors.Is(err, idempotency.ErrNotFound) {
					t.Errorf("%s on the user's prefix: %v; want ErrNotFound", op, err)
				}
			case prefix == "ok" && err != nil:
				t.Errorf("%s on the user's prefix: %v", op, err)
			case prefix != "ok" && (!errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "permission denied")):
				t.Errorf("%s on a prefix the user may not write: %v; want ErrInvalid, not ErrUnavailable, saying permission denied", op, err)
			}
		}
	}
}

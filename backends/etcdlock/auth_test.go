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
)

// authEtcd starts a private etcd with authentication on, and a user whose
// password holds the characters a URL must escape, allowed to read and
// write only the keys from "ok" to "ol" and, if markers is set, the
// revocation markers. It returns a client of that user.
func authEtcd(t *testing.T, markers bool) *clientv3.Client {
	t.Helper()
	ep := privateEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root := newClient(t, []string{ep})
	user, password := "limited", "p/@%:w?#"
	steps := []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "locks"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "locks", "ok", "ol", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error {
			if !markers {
				return nil
			}
			_, err := root.RoleGrantPermission(ctx, "locks", RevokedPrefix, clientv3.GetPrefixRangeEnd(RevokedPrefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, user, password); return err },
		func() error { _, err := root.UserGrantRole(ctx, user, "locks"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, Username: user, Password: password, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
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

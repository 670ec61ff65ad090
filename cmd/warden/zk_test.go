package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestOnZooKeeperWithCredentials: a lock held by a service whose zk:// URL
// has a digest user's credentials is that user's alone: the CLI, given the
// same URL, shows it and releases it; given the URL without them, it is
// refused. No output shows the password.
func TestOnZooKeeperWithCredentials(t *testing.T) {
	hosts := drivertest.Addr(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181")
	const password = "s3c@r/e:t%"
	plain := "zk://" + hosts
	secured := "zk://ops:" + url.QueryEscape(password) + "@" + hosts

	ctx := context.Background()
	g := zkGuard(t, hosts, secured, "orders-svc/7")
	key := fmt.Sprintf("cli/zk-credentials/%d", time.Now().UnixNano())
	held, err := g.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)

	var shown []string
	code, out, errOut := cliRun(t, "", "-lock", plain, "locks", "show", key)
	shown = append(shown, out, errOut)
	if code != 1 || !strings.Contains(errOut, "not authenticated") {
		t.Errorf("locks show without credentials: %d %q %q; want exit 1 and the refusal", code, out, errOut)
	}
	code, out, errOut = cliRun(t, "", "-lock", secured, "locks", "show", key)
	shown = append(shown, out, errOut)
	if code != 0 || !strings.Contains(out, "orders-svc/7") {
		t.Fatalf("locks show with credentials: %d %q %q; want the holder", code, out, errOut)
	}
	code, out, errOut = cliRun(t, "y\n", "-lock", secured, "locks", "release", key)
	shown = append(shown, out, errOut)
	if code != 0 || !strings.Contains(out, "released") {
		t.Fatalf("locks release with credentials: %d %q %q", code, out, errOut)
	}
	select {
	case <-held.Context().Done():
	case <-time.After(10 * time.Second):
		t.Error("the holder's context was not cancelled by the release")
	}
	for _, s := range shown {
		for _, part := range []string{password, url.QueryEscape(password), "s3c", "e:t"} {
			if strings.Contains(s, part) {
				t.Errorf("output shows the password: %q", s)
			}
		}
	}
}

// TestListWithAnotherUsersLock: locks ls without credentials lists the
// locks around one that a user's ACL keeps it from reading, and that one
// with a "?" row (in JSON, with its error), and exits with status 4, so
// that a script tells the page from a whole one.
func TestListWithAnotherUsersLock(t *testing.T) {
	hosts := drivertest.Addr(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181")
	plain := "zk://" + hosts
	ctx := context.Background()
	prefix := fmt.Sprintf("cli/zk-unreadable/%d/", time.Now().UnixNano())
	for _, lock := range []struct{ url, owner, key string }{
		{plain, "open-svc", "a"},
		{"zk://ops:s3cret@" + hosts, "orders-svc/7", "b"},
		{plain, "open-svc", "c"},
	} {
		held, err := zkGuard(t, hosts, lock.url, lock.owner).Lock(ctx, prefix+lock.key)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(ctx)
	}
	code, out, errOut := cliRun(t, "", "-lock", plain, "locks", "ls", prefix)
	rows := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		key, rest, _ := strings.Cut(line, " ")
		rows[strings.TrimPrefix(key, prefix)] = strings.Join(strings.Fields(rest), " ")
	}
	if code != exitUnreadable || rows["a"] == "" || rows["c"] == "" || rows["b"] != "? ? ? ?" || strings.Contains(out, "orders-svc") ||
		!strings.Contains(errOut, `lock "`+prefix+`b"`) || !strings.Contains(errOut, "not authenticated") {
		t.Errorf("locks ls: %d\n%s%s\nwant exit %d, rows for a and c, a \"?\" row for b, and b's refusal on stderr", code, out, errOut, exitUnreadable)
	}
	code, out, errOut = cliRun(t, "", "-json", "-lock", plain, "locks", "ls", prefix)
	var page []struct {
		Key     string         `json:"key"`
		Holders []guard.Holder `json:"holders"`
		Error   string         `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil || code != exitUnreadable || len(page) != 3 {
		t.Fatalf("locks ls -json: %d %q %q (%v); want exit %d and three locks", code, out, errOut, err, exitUnreadable)
	}
	for _, in := range page {
		if unread := in.Key == prefix+"b"; unread != (in.Error != "") || unread != (len(in.Holders) == 0) {
			t.Errorf("locks ls -json: %+v; want b alone with an error and no holder", in)
		}
	}
}

// zkGuard is a Guard on the Locker that rawURL, a zk:// URL of hosts, opens,
// whose locks are labelled owner. The roots, which the first Locker to need
// them makes with its own ACL, are made first with the world's, so that they
// stay open to the tests that run without credentials.
func zkGuard(t *testing.T, hosts, rawURL, owner string) *guard.Guard {
	t.Helper()
	u, err := backendurl.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	anon, _, err := zk.Connect(strings.Split(hosts, ","), 10*time.Second, zk.WithLogger(discardZK{}))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	for _, p := range []string{"/warden", "/warden/locks"} {
		if _, err := anon.Create(p, nil, zk.FlagPersistent, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	o := backendurl.NewOpener()
	t.Cleanup(o.Close)
	locker, err := o.Locker(context.Background(), u, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(locker, guard.WithOwner(owner), guard.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// discardZK drops the ZooKeeper client's log.
type discardZK struct{}

func (discardZK) Printf(string, ...any) {}

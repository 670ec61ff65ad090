package main

import (
	"context"
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

	// The roots, which the first Locker to need them makes with its own
	// ACL, are made here with the world's: they stay open to the tests
	// that run without credentials.
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

	ctx := context.Background()
	u, err := backendurl.Parse(secured)
	if err != nil {
		t.Fatal(err)
	}
	o := backendurl.NewOpener()
	t.Cleanup(o.Close)
	locker, err := o.Locker(ctx, u, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(locker, guard.WithOwner("orders-svc/7"), guard.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
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

// discardZK drops the ZooKeeper client's log.
type discardZK struct{}

func (discardZK) Printf(string, ...any) {}

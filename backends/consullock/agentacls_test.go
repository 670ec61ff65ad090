package consullock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// agentWithoutACLs starts a server with ACLs on (default deny) and a
// client agent with them off joined to it, as while ACLs are rolled out
// (servers first), and returns the client agent's address, the server's,
// and the server's management client.
func agentWithoutACLs(t *testing.T) (client, server string, root *api.Client) {
	t.Helper()
	server, root = aclAgent(t)
	self, err := root.Agent().Self()
	if err != nil {
		t.Fatal(err)
	}
	client, exited, log := runAgent(t, "-node", "warden-acl-client", "-data-dir", t.TempDir(),
		"-retry-join", fmt.Sprintf("127.0.0.1:%v", self["Member"]["Port"]))
	c := newClient(t, client)
	eventually(t, time.Minute, "the client agent joined", func() bool {
		select {
		case <-exited:
			t.Fatalf("the client agent exited: %s", log.String())
		default:
		}
		n, _, err := root.Catalog().Node("warden-acl-client", nil)
		return err == nil && n != nil && n.Node != nil
	})
	if _, _, err := c.ACL().TokenReadSelf(nil); err == nil {
		t.Fatal("the client agent answers token/self: it has ACLs on, and the test shows nothing")
	}
	return client, server, root
}

// TestDotListThroughAgentWithoutACLs lists the prefix "." through a client
// agent with ACLs off in front of a server with them on: the agent answers
// token/self that ACLs are off, and the server filters the transaction
// that reads the prefix without a word. A held name the token may not read
// must make the page partial, not leave it out of a page said to be whole.
func TestDotListThroughAgentWithoutACLs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, server, root := agentWithoutACLs(t)
	sid, _, err := root.Session().Create(&api.SessionEntry{TTL: "60s", Behavior: "delete"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	open, hidden := ".open", ".hidden"
	for _, n := range []string{open, hidden} {
		if ok, _, err := root.KV().Acquire(&api.KVPair{Key: LockKey(n), Session: sid}, nil); err != nil || !ok {
			t.Fatalf("acquire %q: %v, %v", n, ok, err)
		}
	}
	tok, _ := grant(t, root, `key_prefix "" { policy = "read" } key "`+LockKey(hidden)+`" { policy = "deny" }`)
	for _, a := range []string{client, server} {
		page, err := lockerOn(t, tokenClient(t, a, tok.SecretID)).List(ctx, ".", "", 100)
		if !errors.Is(err, driver.ErrPartialList) {
			t.Errorf("List(\".\") through %s, %q withheld: %+v, %v; want %v", a, hidden, page, err, driver.ErrPartialList)
		}
	}
}

// TestAgentWithoutACLsReadsByToken: behind a client agent with ACLs off,
// in front of a server with them on, a Locker whose client carries a
// token that may read and write everything reads with that token, which
// the server judges: nothing is hidden from it, so nothing is refused. The
// agent's "ACL support disabled" is its own configuration's, not the
// servers'; reads made as the anonymous token were refused.
func TestAgentWithoutACLsReadsByToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, _, root := agentWithoutACLs(t)
	tok, _ := grant(t, root, everything)
	c := tokenClient(t, client, tok.SecretID)
	l := lockerOn(t, c)
	k := name("aclsoff-agent")
	if le, err := l.AcquireRead(ctx, k, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Errorf("AcquireRead: %v, %v", le, err)
	}
	if le, err := l.AcquireSemaphore(ctx, k, 2, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Errorf("AcquireSemaphore: %v, %v", le, err)
	}
	if in, err := l.Inspect(ctx, k); err != nil {
		t.Errorf("Inspect: %+v, %v", in, err)
	}
	if page, err := l.List(ctx, testPrefix, "", 10); err != nil {
		t.Errorf("List: %d names, %v", len(page), err)
	}
	if _, err := storeOn(t, c).Purge(ctx); err != nil {
		t.Errorf("Purge: %v", err)
	}
}

// TestFilteredReadAsksOnce: a token from which one key is hidden, for good,
// has every List partial; it asks token/self once, not again at each
// filtered read, which would double the requests of every page.
func TestFilteredReadAsksOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, root := aclAgent(t)
	hidden := name("hidden")
	if _, err := lockerOn(t, root).Acquire(ctx, hidden, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Fatal(err)
	}
	tok, _ := grant(t, root, everything+` key "`+LockKey(hidden)+`" { policy = "deny" }`)
	var asked atomic.Int64
	c, _ := countedClient(t, a, tok.SecretID, func(r *http.Request) bool {
		if r.URL.Path == "/v1/acl/token/self" {
			asked.Add(1)
		}
		return false
	})
	l := lockerOn(t, c)
	for range 10 {
		if _, err := l.List(ctx, testPrefix, "", 10); !errors.Is(err, driver.ErrPartialList) {
			t.Fatalf("List with %q hidden: %v; want %v", hidden, err, driver.ErrPartialList)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("10 partial Lists asked token/self %d times; want 1", n)
	}
}

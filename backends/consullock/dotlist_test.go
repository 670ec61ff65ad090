package consullock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// TestDotListThroughAgentWithoutACLs lists the prefix "." through a client
// agent with ACLs off in front of a server with them on, as while ACLs are
// rolled out (servers first): the agent answers token/self that ACLs are
// off, and the server filters the transaction that reads the prefix
// without a word. A held name the token may not read must make the page
// partial, not leave it out of a page said to be whole.
func TestDotListThroughAgentWithoutACLs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server, root := aclAgent(t)
	self, err := root.Agent().Self()
	if err != nil {
		t.Fatal(err)
	}
	client, exited, log := runAgent(t, "-node", "warden-acl-client", "-data-dir", t.TempDir(),
		"-retry-join", fmt.Sprintf("127.0.0.1:%v", self["Member"]["Port"]))
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
	c := tokenClient(t, client, tok.SecretID)
	eventually(t, time.Minute, "the client agent joined", func() bool {
		select {
		case <-exited:
			t.Fatalf("the client agent exited: %s", log.String())
		default:
		}
		_, _, err := c.KV().Get(LockKey(open), nil)
		return err == nil
	})
	if _, _, err := c.ACL().TokenReadSelf(nil); err == nil {
		t.Fatal("the client agent answers token/self: it has ACLs on, and the test shows nothing")
	}
	for _, a := range []string{client, server} {
		page, err := lockerOn(t, tokenClient(t, a, tok.SecretID)).List(ctx, ".", "", 100)
		if !errors.Is(err, driver.ErrPartialList) {
			t.Errorf("List(\".\") through %s, %q withheld: %+v, %v; want %v", a, hidden, page, err, driver.ErrPartialList)
		}
	}
}

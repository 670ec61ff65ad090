package consullock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
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
	open, hidden := ".open", ".hidden"
	hold(t, root, open, hidden)
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

// TestDotListRightsWidenedBetweenReads: List of the prefix "." reads the
// prefix by a transaction, which Consul filters without a word, then the
// store's names, for Consul's filtering report. A token whose rights widen
// between the two (its policy no longer denying a held name) is reported
// nothing by the listing: a name the listing shows under the prefix and the
// transaction did not is read on its own, and listed, not left out of a
// page said whole.
func TestDotListRightsWidenedBetweenReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, root := aclAgent(t)
	open, hidden := ".open", ".hidden"
	hold(t, root, open, hidden)
	tok, p := grant(t, root, `key_prefix "" { policy = "read" } key "`+LockKey(hidden)+`" { policy = "deny" }`)
	var widened atomic.Bool
	c, _ := countedClient(t, a, tok.SecretID, func(r *http.Request) bool {
		if r.URL.Path == "/v1/kv/" && r.URL.Query().Has("keys") && widened.CompareAndSwap(false, true) {
			p.Rules = `key_prefix "" { policy = "read" }`
			if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
				t.Error(err)
			}
		}
		return false
	})
	page, err := lockerOn(t, c).List(ctx, ".", "", 100)
	if !widened.Load() {
		t.Fatal("the names were not listed: the test shows nothing")
	}
	listed := slices.ContainsFunc(page, func(e driver.Listed) bool { return e.Key == hidden })
	if !listed && !errors.Is(err, driver.ErrPartialList) {
		t.Errorf("List(\".\"), %q hidden from the transaction alone: %+v, %v; want it listed, or %v", hidden, page, err, driver.ErrPartialList)
	}
}

// TestAgentTurningACLsOnFoundAtOnce: a Locker whose client has no token
// asked token/self while its agent had ACLs off; the agent then has them
// on (here the client's requests go to another agent of the same servers,
// with them on), and the anonymous token may not read a held name. An
// answer kept from before would have the Locker read as the anonymous
// token without a word from Consul, for up to a minute: its page must be
// partial at once.
func TestAgentTurningACLsOnFoundAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	off, _, root := agentWithoutACLs(t)
	self, err := root.Agent().Self()
	if err != nil {
		t.Fatal(err)
	}
	on, exited, log := runAgent(t, "-node", "warden-acl-client-on", "-data-dir", t.TempDir(),
		"-hcl", `acl { enabled = true default_policy = "deny" }`,
		"-retry-join", fmt.Sprintf("127.0.0.1:%v", self["Member"]["Port"]))
	eventually(t, time.Minute, "the second client agent joined", func() bool {
		select {
		case <-exited:
			t.Fatalf("the second client agent exited: %s", log.String())
		default:
		}
		n, _, err := root.Catalog().Node("warden-acl-client-on", nil)
		return err == nil && n != nil && n.Node != nil
	})
	open, hidden := name("open"), name("hidden")
	allowAnonymous(t, root, `key_prefix "" { policy = "read" } key "`+LockKey(hidden)+`" { policy = "deny" }`)
	hold(t, root, open, hidden)
	var switched atomic.Bool
	l := lockerOn(t, clientThrough(t, off, "", func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if switched.Load() {
				r.URL.Host = on
			}
			return base.RoundTrip(r)
		})
	}))
	if _, err := l.List(ctx, testPrefix, "", 100); err != nil {
		t.Fatalf("List through the agent with ACLs off: %v", err)
	}
	switched.Store(true)
	if page, err := l.List(ctx, testPrefix, "", 100); !errors.Is(err, driver.ErrPartialList) {
		t.Errorf("List through an agent with ACLs on, %q hidden from the anonymous token: %d names, %v; want %v", hidden, len(page), err, driver.ErrPartialList)
	}
}

// hold acquires the lock keys of names by a session of root's.
func hold(t *testing.T, root *api.Client, names ...string) {
	t.Helper()
	sid, _, err := root.Session().Create(&api.SessionEntry{TTL: "60s", Behavior: "delete"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if ok, _, err := root.KV().Acquire(&api.KVPair{Key: LockKey(n), Session: sid}, nil); err != nil || !ok {
			t.Fatalf("acquire %q: %v, %v", n, ok, err)
		}
	}
}

// TestDotListUnderChurn: List of "." while a lock under it is taken and
// released in a loop, with ACLs off: a name the names listing shows and
// the transaction before it did not (taken between the two) is no sign of
// a key hidden from the token, and no page is said partial.
func TestDotListUnderChurn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := addr(t)
	l := lockerOn(t, newClient(t, a))
	churn := lockerOn(t, newClient(t, a))
	hot := "." + name("hot")
	cctx, ccancel := context.WithCancel(ctx)
	var cycles atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			if le, err := churn.Acquire(cctx, hot, driver.AcquireOptions{TTL: MinTTL}); err == nil {
				_ = le.Release(cctx)
				cycles.Add(1)
			}
		}
	}()
	partial := 0
	for range 200 {
		if _, err := l.List(ctx, ".", "", 100); errors.Is(err, driver.ErrPartialList) {
			partial++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	ccancel()
	<-done
	if cycles.Load() == 0 {
		t.Fatal("the lock under \".\" was never taken: the test shows nothing")
	}
	if partial > 0 {
		t.Errorf("%d of 200 List(\".\") said partial, with ACLs off, while %q was taken %d times", partial, hot, cycles.Load())
	}
}

// TestDotListNameOfAnotherPath: List of "." while another tool writes,
// between its transaction and its names listing, a key under "." whose
// path Consul's HTTP server would clean into another key's or endpoint's
// (a held lock's own, through the path of no name's key, or of another
// lock's, or of itself; an agent endpoint), or refuse (a control
// character). The held lock is listed once, with its one holder, and List
// does not fail. The name's own read, by its path, read the held lock's
// key again, and the page listed it with two holders, said whole; or it
// read the agent's endpoint, or was refused, and List failed.
func TestDotListNameOfAnotherPath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := addr(t)
	root := newClient(t, a)
	n := "." + strings.ReplaceAll(name("cleaned"), "/", "-")
	hold(t, root, n)
	for _, foreign := range []string{
		fmt.Sprintf(".other-%d/../%s", time.Now().UnixNano(), LockKey(n)),
		fmt.Sprintf("%s/../%s", LockKey(fmt.Sprintf(".other-%d", time.Now().UnixNano())), LockKey(n)),
		fmt.Sprintf("%s//x/..", LockKey(n)),
		fmt.Sprintf("%s/../../agent/self", LockKey(fmt.Sprintf(".other-%d", time.Now().UnixNano()))),
		RWDir(fmt.Sprintf(".other-%d", time.Now().UnixNano())) + "\n",
	} {
		var once sync.Once
		written := false
		c := clientThrough(t, a, "", func(base http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodGet && r.URL.Path == "/v1/kv/" && r.URL.Query().Has("keys") {
					once.Do(func() {
						written = true
						// A transaction names the key in its body, which
						// no one cleans.
						ok, resp, _, err := root.KV().Txn(api.KVTxnOps{{Verb: api.KVSet, Key: foreign, Value: []byte("x")}}, nil)
						if err != nil || !ok {
							t.Errorf("write %q: %v, %v, %+v", foreign, ok, err, resp)
						}
					})
				}
				return base.RoundTrip(r)
			})
		})
		page, err := lockerOn(t, c).List(ctx, ".", "", 1000)
		if _, _, _, err := root.KV().Txn(api.KVTxnOps{{Verb: api.KVDelete, Key: foreign}}, nil); err != nil {
			t.Fatal(err)
		}
		if !written {
			t.Fatalf("List(\".\") sent no names listing: %q was never written between its reads", foreign)
		}
		if err != nil && !errors.Is(err, driver.ErrPartialList) {
			t.Fatalf("%q written: %v", foreign, err)
		}
		listed := false
		for _, e := range page {
			if e.Key == n {
				listed = true
				if len(e.Holders) != 1 {
					t.Errorf("%q written: %q, held once, listed with %d holders (error %v)", foreign, n, len(e.Holders), err)
				}
			}
		}
		if err == nil && !listed {
			t.Errorf("%q written: %q, held, not in a page said whole", foreign, n)
		}
	}
}

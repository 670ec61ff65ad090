package consullock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// everything is an ACL policy's rules that allow a Locker every request.

// contenderKey is the one contender key under dir, read by the management
// client root.
func contenderKey(t *testing.T, root *api.Client, dir string) string {
	t.Helper()
	keys, _, err := root.KV().Keys(dir, "", nil)
	if err != nil || len(keys) != 1 {
		t.Fatalf("the keys under %q: %q, %v", dir, keys, err)
	}
	return keys[0]
}

// TestAnonymousUnderDefaultAllow: under the default policy allow, a client
// without a token reads as the anonymous token, whose policies may deny
// keys, and Consul filters a request without a token without a word. A
// holder's key denied to the anonymous token, such a client was granted
// the read lock a writer held and the permit of a semaphore of one, and
// its Store's Purge took the chunks of a record it could not read for no
// record's and deleted them. It is refused, for want of ACL rights; a
// lock whose keys the anonymous token may read is granted as ever.
func TestAnonymousUnderDefaultAllow(t *testing.T) {
	a, root := aclAgent(t, `default_policy = "allow"`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := lockerOn(t, root)
	rw, sem, open := name("allow-rw"), name("allow-sem"), name("allow-open")
	if _, err := holder.AcquireWrite(ctx, rw, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{sem, open} {
		if _, err := holder.AcquireSemaphore(ctx, k, 1, driver.AcquireOptions{TTL: MinTTL}); err != nil {
			t.Fatal(err)
		}
	}
	prefix := fmt.Sprintf("%sallow-%d/", storePrefix, time.Now().UnixNano())
	owner := storeOn(t, root, WithStorePrefix(prefix))
	if rec, err := owner.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute}); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	response := bytes.Repeat([]byte{1}, inlineResponse+1) // in chunks
	if err := owner.Complete(ctx, "", "k", "o", response, time.Hour); err != nil {
		t.Fatal(err)
	}
	allowAnonymous(t, root, everything+
		` key "`+contenderKey(t, root, RWDir(rw))+`" { policy = "deny" }`+
		` key "`+contenderKey(t, root, SemaphoreDir(sem))+`" { policy = "deny" }`+
		` key "`+owner.recordKey("", "k")+`" { policy = "deny" }`)

	noToken := tokenClient(t, a, "")
	l := lockerOn(t, noToken)
	for _, wait := range []bool{false, true} {
		opts := driver.AcquireOptions{TTL: MinTTL, Wait: wait}
		if le, err := l.AcquireRead(ctx, rw, opts); !errors.Is(err, errDenied) || !strings.Contains(err.Error(), "anonymous token") {
			t.Errorf("wait %v: AcquireRead while its writer's key is hidden: %v, %v; want an error for want of ACL rights, naming the anonymous token", wait, le, err)
		}
		if le, err := l.AcquireSemaphore(ctx, sem, 1, opts); !errors.Is(err, errDenied) {
			t.Errorf("wait %v: AcquireSemaphore of 1 while its holder's key is hidden: %v, %v; want an error for want of ACL rights", wait, le, err)
		}
	}
	if in, err := l.Inspect(ctx, rw); !errors.Is(err, errDenied) {
		t.Errorf("Inspect of a name whose writer's key is hidden: %+v, %v; want an error for want of ACL rights", in, err)
	}
	if le, err := l.AcquireSemaphore(ctx, open, 2, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Errorf("AcquireSemaphore of 2 of a semaphore whose holder's key the anonymous token reads: %v, %v; want it granted", le, err)
	}
	if n, err := storeOn(t, noToken, WithStorePrefix(prefix)).Purge(ctx); !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrUnavailable) ||
		!strings.Contains(err.Error(), "ACL rights") || !strings.Contains(err.Error(), "anonymous token") {
		t.Errorf("Purge while a record is hidden: (%d, %v); want ErrInvalid, not ErrUnavailable, for want of ACL rights, naming the anonymous token", n, err)
	}
	if rec, err := owner.Get(ctx, "", "k"); err != nil || !bytes.Equal(rec.Response, response) {
		t.Errorf("the record after Purge: %v; want it whole", err)
	}
}

// TestAgentTokenChanged: a client without a token of its own carries the
// agent's default token, which may be set, cleared, or replaced and
// deleted, at any time. A Locker that had found its requests carrying a
// real token took that answer for a minute: with the agent's token
// cleared, its requests read as the anonymous token, whose policy hides a
// writer's key, and it was granted the read lock that writer held. It is
// not granted it; with the agent's token set or replaced (the old one
// deleted), it reads as the new one at once, without a refusal.
func TestAgentTokenChanged(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := lockerOn(t, tokenClient(t, a, ""))
	rw := name("agent-token")
	// Its first read finds no token: nothing is there to leave out.
	if in, err := l.Inspect(ctx, rw); err != nil || len(in.Holders) != 0 {
		t.Fatalf("Inspect without a token: %+v, %v; want the name free", in, err)
	}
	writer := lockerOn(t, allowed(t, a, root, everything))
	held, err := writer.AcquireWrite(ctx, rw, driver.AcquireOptions{TTL: MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	agentToken, _ := grant(t, root, everything)
	if _, err := root.Agent().UpdateDefaultACLToken(agentToken.SecretID, nil); err != nil {
		t.Fatal(err)
	}
	if in, err := l.Inspect(ctx, rw); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect with the agent's token set: %+v, %v; want the writer", in, err)
	}
	allowAnonymous(t, root, everything+` key "`+contenderKey(t, root, RWDir(rw))+`" { policy = "deny" }`)
	if _, err := root.Agent().UpdateDefaultACLToken("", nil); err != nil {
		t.Fatal(err)
	}
	if le, err := l.AcquireRead(ctx, rw, driver.AcquireOptions{TTL: MinTTL}); !errors.Is(err, driver.ErrNotAcquired) && !errors.Is(err, errDenied) {
		t.Fatalf("AcquireRead while a writer holds, the agent's token cleared: %v, %v; want it not granted", le, err)
	}

	// The agent's token replaced, the old one deleted.
	again, _ := grant(t, root, everything)
	if _, err := root.Agent().UpdateDefaultACLToken(again.SecretID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := root.ACL().TokenDelete(agentToken.AccessorID, nil); err != nil {
		t.Fatal(err)
	}
	if le, err := l.AcquireRead(ctx, rw, driver.AcquireOptions{TTL: MinTTL}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("AcquireRead while a writer holds, the agent's token replaced: %v, %v; want driver.ErrNotAcquired", le, err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if le, err := l.AcquireRead(ctx, rw, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Errorf("AcquireRead once the writer left: %v, %v; want it granted", le, err)
	}
}

// TestACLsOffUnderDefaultDeny: an agent with ACLs off whose configuration
// names the default policy deny says so in every answer's
// X-Consul-Default-ACL-Policy, and answers token/self with 401 "ACL
// support disabled": a read/write lock, a semaphore and Inspect failed
// with that answer. With ACLs off Consul leaves nothing out of a read.
func TestACLsOffUnderDefaultDeny(t *testing.T) {
	a, _ := aclAgent(t, "enabled = false")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := tokenClient(t, a, "")
	if _, meta, err := c.KV().List(testPrefix, nil); err != nil || meta.DefaultACLPolicy != "deny" {
		t.Fatalf("a read's default ACL policy: %v; want deny", err)
	}
	l := lockerOn(t, c)
	k := name("acls-off")
	for what, acquire := range map[string]func() (driver.Lease, error){
		"AcquireRead":      func() (driver.Lease, error) { return l.AcquireRead(ctx, k, driver.AcquireOptions{TTL: MinTTL}) },
		"AcquireSemaphore": func() (driver.Lease, error) { return l.AcquireSemaphore(ctx, k, 2, driver.AcquireOptions{TTL: MinTTL}) },
	} {
		if _, err := acquire(); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	if in, err := l.Inspect(ctx, k); err != nil || len(in.Holders) != 2 {
		t.Errorf("Inspect: %+v, %v; want the reader and the permit", in, err)
	}
	st := storeOn(t, c)
	if _, err := st.Purge(ctx); err != nil {
		t.Errorf("Purge: %v", err)
	}
}

// TestTokenAskedOnce: a Locker asks Consul which token its reads carry
// once, not with every read, under either default policy: ten Inspects,
// each one read, cost eleven requests (guard.Observe inspects every tenth
// of the TTL). With ACLs off it asks at each, the agent answering itself,
// so that a Locker whose client has no token is not left reading unwarned
// once its agent has them on: twenty.
func TestTokenAskedOnce(t *testing.T) {
	deny, root := aclAgent(t)
	allow, allowRoot := aclAgent(t, `default_policy = "allow"`)
	const reads = `key_prefix "" { policy = "read" } session_prefix "" { policy = "read" }`
	denyToken, _ := grant(t, root, reads)
	allowToken, _ := grant(t, allowRoot, reads)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		setting, addr, token string
		per                  int64
	}{
		{"default deny", deny, denyToken.SecretID, 0},
		{"default allow", allow, allowToken.SecretID, 0},
		{"ACLs off", addr(t), "", 1},
	} {
		client, requests := countedClient(t, c.addr, c.token, func(*http.Request) bool { return true })
		l := lockerOn(t, client)
		const inspects = 10
		for range inspects {
			if _, err := l.Inspect(ctx, name("asked-once")); err != nil {
				t.Fatal(err)
			}
		}
		if n, want := requests.Load(), inspects+1+(inspects-1)*c.per; n != want {
			t.Errorf("%s: %d Inspects: %d requests; want %d", c.setting, inspects, n, want)
		}
	}
}

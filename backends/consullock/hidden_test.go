package consullock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// TestHiddenMarkerLosesTheLock: a holder whose ACL rules change while it
// holds a lock, so that it may no longer read the marker a forced release
// leaves it, loses the lock (its session given up, which frees its keys)
// once the marker is written, rather than work on while an operator's
// next holder holds the lock. Consul wakes the session's query on its
// markers, leaves the marker out and says so, to a request with a token;
// to one without, it says nothing, and a rule that hides the session's
// anchor too is found out by the anchor, gone from the read, refused anew;
// a token that may not list the markers, under acl.enable_key_list_policy,
// has the query refused, and the session is given up when no read is
// answered by its loss deadline, nine tenths of the TTL or less after the
// first refusal. Each holder went on unaware, the lock held twice.
// The holder's next acquisition is refused when the rules hide the new
// session's markers too (its anchor refused), and granted when they named
// the old session.
func TestHiddenMarkerLosesTheLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Each case's rules, given the holder's lease, once it holds the lock.
	hidings := []struct {
		name    string
		rules   func(le *lease) string
		refused bool // the next acquisition
	}{
		{"the marker denied", func(le *lease) string {
			return everything + ` key "` + marker(le.s.id, le.key, le.created) + `" { policy = "deny" }`
		}, false},
		{"the lock's markers denied", func(le *lease) string {
			return everything + ` key_prefix "` + revokedDir(le.s.id) + le.key + `/" { policy = "deny" }`
		}, false},
		{"RevokedPrefix denied", func(*lease) string {
			return everything + ` key_prefix "` + RevokedPrefix + `" { policy = "deny" }`
		}, true},
		{"no rule for RevokedPrefix", func(*lease) string {
			return `key_prefix "` + testPrefix[:strings.IndexByte(testPrefix, '/')] + `" { policy = "write" } session_prefix "" { policy = "write" }`
		}, true},
	}

	a, root := aclAgent(t)
	for _, h := range hidings {
		t.Run(h.name, func(t *testing.T) {
			tok, p := grant(t, root, everything)
			l := heldTwice(ctx, t, a, root, tok.SecretID, func(le *lease) {
				p.Rules = h.rules(le)
				if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
					t.Fatal(err)
				}
			})
			nextAcquisition(ctx, t, l, h.refused)
		})
	}

	t.Run("without a token, RevokedPrefix denied", func(t *testing.T) {
		tok := allowAnonymous(t, root, everything)
		p, _, err := root.ACL().PolicyRead(tok.Policies[0].ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		l := heldTwice(ctx, t, a, root, "", func(*lease) {
			p.Rules = everything + ` key_prefix "` + RevokedPrefix + `" { policy = "deny" }`
			if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
				t.Fatal(err)
			}
		})
		nextAcquisition(ctx, t, l, true)
	})

	t.Run("without list on RevokedPrefix", func(t *testing.T) {
		a, root := aclAgent(t, "enable_key_list_policy = true")
		tok, p := grant(t, root, everything)
		l := heldTwice(ctx, t, a, root, tok.SecretID, func(*lease) {
			p.Rules = everything + ` key_prefix "` + RevokedPrefix + `" { policy = "read" }`
			if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
				t.Fatal(err)
			}
		})
		nextAcquisition(ctx, t, l, true)
	})
}

// heldTwice has a Locker with token, on the ACL agent at a whose
// management client is root, acquire a lock, calls hide with its lease
// once the session's query on its markers waits, has that query sent
// again (Consul judges a blocking query by the rules as they were when it
// came), and has root take the lock by ForceRelease and acquire it; it
// fails the test unless the holder is told (its lease revoked, or its
// session ended) within the TTL, and returns the holder's Locker (a read
// refused is sent again until the session's loss deadline, nine tenths of
// the TTL or less after the first). A read by the new rules may end the
// session before the forced release, which then finds the lock free.
func heldTwice(ctx context.Context, t *testing.T, a string, root *api.Client, token string, hide func(*lease)) *Locker {
	t.Helper()
	c, watches := countedClient(t, a, token, markerRead)
	return heldTwiceThrough(ctx, t, root, c, watches, hide)
}

// heldTwiceThrough is heldTwice with the holder's client c, whose marker
// reads watches counts.
func heldTwiceThrough(ctx context.Context, t *testing.T, root *api.Client, c *api.Client, watches *atomic.Int64, hide func(*lease)) *Locker {
	t.Helper()
	k := name("hidden-marker")
	l := lockerOn(t, c)
	le, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL, Owner: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	held := le.(*lease)
	revoked := make(chan struct{})
	held.OnRevoke(func() { close(revoked) })
	// The first query reads the directory, the second waits.
	eventually(t, 10*time.Second, "the marker query waiting", func() bool { return watches.Load() >= 2 })
	hide(held)
	wake(t, root, held.s, watches)

	op := lockerOn(t, root)
	rm, err := op.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true})
	if err != nil || len(rm) != 1 && !held.s.lost() {
		t.Fatalf("ForceRelease: %v, %v; want the holder removed", rm, err)
	}
	if _, err := op.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL, Owner: "next"}); err != nil {
		t.Fatalf("the next holder's Acquire: %v", err)
	}
	select {
	case <-revoked:
	case <-held.s.Done():
	case <-time.After(MinTTL):
		t.Fatal("the holder was not told its lock was taken: the lock is held twice")
	}
	return l
}

// nextAcquisition fails the test unless l's next acquisition is refused,
// for want of ACL rights on RevokedPrefix, when refused is set, and
// granted otherwise.
func nextAcquisition(ctx context.Context, t *testing.T, l *Locker, refused bool) {
	t.Helper()
	le, err := l.Acquire(ctx, name("after-hidden"), driver.AcquireOptions{TTL: MinTTL})
	switch {
	case refused && (!errors.Is(err, errDenied) || !strings.Contains(err.Error(), RevokedPrefix)):
		t.Errorf("the next acquisition: %v, %v; want it refused for want of ACL rights on %s", le, err, RevokedPrefix)
	case !refused && err != nil:
		t.Errorf("the next acquisition: %v; want it granted, with a session of its own", err)
	}
}

// markerRead reports whether r reads markers, as a session's query on its
// marker directory does.
func markerRead(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/kv/"+RevokedPrefix)
}

// wake writes over the anchor of s, by root, which keeps its session and
// wakes its query on its markers, and waits until the query, counted by
// watches, is sent again, or the session ends. The value is new each
// time: Consul applies no write that changes nothing.
func wake(t *testing.T, root *api.Client, s *session, watches *atomic.Int64) {
	t.Helper()
	sent := watches.Load()
	if _, err := root.KV().Put(&api.KVPair{Key: revokedDir(s.id), Value: strconv.AppendInt(nil, sent, 10)}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the marker query sent again", func() bool { return watches.Load() > sent || s.lost() })
}

// claimingStore has a Store on c, under a prefix of its own named for
// what, claim the key "k" as the owner "o", and returns the Store and its
// session once the session's query on its markers, counted by watches,
// waits.
func claimingStore(ctx context.Context, t *testing.T, c *api.Client, what string, watches *atomic.Int64) (*Store, *session) {
	t.Helper()
	st := storeOn(t, c, WithStorePrefix(fmt.Sprintf("%s%s-%d/", storePrefix, what, time.Now().UnixNano())))
	if rec, err := st.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute}); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	st.sessions.mu.Lock()
	s := st.sessions.sessions[st.ttl]
	st.sessions.mu.Unlock()
	eventually(t, 10*time.Second, "the marker query waiting", func() bool { return watches.Load() >= 2 })
	return st, s
}

// TestStoreKeptWithMarkersHidden: a Store whose token loses its rights on
// RevokedPrefix while it holds a claim keeps its session, and the claim,
// though its marker query's reads leave its anchor out, and its anchor is
// refused anew: no marker names a Store's session, which holds no locks.
// The session was given up, and the claim lost with it.
func TestStoreKeptWithMarkersHidden(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, root := aclAgent(t)
	tok, p := grant(t, root, everything)
	c, watches := countedClient(t, a, tok.SecretID, markerRead)
	st, s := claimingStore(ctx, t, c, "hidden", watches)
	p.Rules = everything + ` key_prefix "` + RevokedPrefix + `" { policy = "deny" }`
	if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
		t.Fatal(err)
	}
	wake(t, root, s, watches) // the query sent before the rules changed
	wake(t, root, s, watches) // and the one by the new rules
	if s.lost() {
		t.Fatal("the Store's session was given up")
	}
	if err := st.Complete(ctx, "", "k", "o", []byte("done"), time.Hour); err != nil {
		t.Errorf("Complete: %v", err)
	}
}

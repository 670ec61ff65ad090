package consullock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// aclAgent starts a Consul dev agent of the test's own, with ACLs on and
// denying whatever a token's policies do not allow (the shared agent has
// no ACLs), and any further settings of its acl block, which override
// those (default_policy = "allow", enabled = false), and returns its
// address and a client with its management token.
func aclAgent(t *testing.T, settings ...string) (string, *api.Client) {
	t.Helper()
	const management = "00000000-0000-4000-8000-0000000000a1"
	a, exited, log := runAgent(t, "-dev", "-node", "warden-acl",
		"-hcl", `acl { enabled = true default_policy = "deny" tokens { initial_management = "`+management+`" } `+strings.Join(settings, " ")+` }`)
	root := tokenClient(t, a, management)
	for deadline := time.Now().Add(time.Minute); ; {
		// A leader, the management token bootstrapped with it (with ACLs
		// on, Consul refuses a token it does not know yet), and the
		// agent's node registered: a session created before that is
		// refused with "Missing node registration".
		if n, _, err := root.Catalog().Node("warden-acl", nil); err == nil && n != nil && n.Node != nil {
			return a, root
		}
		select {
		case <-exited:
			t.Fatalf("the ACL agent exited: %s", log.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ACL agent did not serve within a minute: %s", log.String())
		}
	}
}

// runAgent starts a Consul agent of the test's own, on loopback ports of
// its own, with args, and returns its HTTP address, a channel closed when
// it exits, and what it logged; the agent is killed when the test ends.
// It returns once the agent listens for HTTP, which it does after taking
// its other ports: a port found free here may be taken by another test
// process before the agent binds it, and the agent is then started again
// on other ports.
func runAgent(t *testing.T, args ...string) (string, <-chan struct{}, *strings.Builder) {
	t.Helper()
	addr(t) // skips with the other server tests
	bin, err := exec.Command("bash", filepath.Join("..", "..", "scripts", "services.sh"), "bin", "consul").Output()
	if err != nil {
		t.Fatalf("scripts/services.sh bin consul: %v", err)
	}
	for attempt := 1; ; attempt++ {
		// The three listeners stay open until all are found: one closed
		// at once may be handed out again, and the agent refuses to
		// start with two of its ports the same.
		var ports []string
		var found []net.Listener
		for range 3 {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			found = append(found, ln)
			ports = append(ports, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
		}
		for _, ln := range found {
			ln.Close()
		}
		cmd := exec.Command(strings.TrimSpace(string(bin)), append([]string{"agent", "-bind", "127.0.0.1", "-client", "127.0.0.1",
			"-http-port", ports[0], "-server-port", ports[1], "-serf-lan-port", ports[2],
			"-serf-wan-port", "-1", "-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1", "-https-port", "-1",
			"-log-level", "error"}, args...)...)
		log := new(strings.Builder)
		cmd.Stdout, cmd.Stderr = log, log
		// Killed with the test process, should the test time out.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() {
			cmd.Wait()
			close(exited)
		}()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		a := "127.0.0.1:" + ports[0]
		for deadline := time.Now().Add(time.Minute); ; {
			if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
				c.Close()
				return a, exited, log
			}
			select {
			case <-exited:
			case <-time.After(20 * time.Millisecond):
				if time.Now().After(deadline) {
					t.Fatalf("the agent did not listen on %s within a minute: %s", a, log.String())
				}
				continue
			}
			break
		}
		if attempt == 5 || !strings.Contains(log.String(), "address already in use") {
			t.Fatalf("the agent exited: %s", log.String())
		}
	}
}

// tokenClient returns a client of its own to a, with token.
func tokenClient(t *testing.T, a, token string) *api.Client {
	t.Helper()
	return clientThrough(t, a, token, func(base http.RoundTripper) http.RoundTripper { return base })
}

// countedClient returns a client of its own to a, with token, and the
// number of the requests it has sent that counts reports true for.
func countedClient(t testing.TB, a, token string, counts func(*http.Request) bool) (*api.Client, *atomic.Int64) {
	t.Helper()
	n := new(atomic.Int64)
	c := clientThrough(t, a, token, func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if counts(r) {
				n.Add(1)
			}
			return base.RoundTrip(r)
		})
	})
	return c, n
}

// allowed returns a client to the agent at a, whose management client is
// root, with a new token of its own that the ACL policy rules allow.
func allowed(t *testing.T, a string, root *api.Client, rules string) *api.Client {
	t.Helper()
	tok, _ := grant(t, root, rules)
	return tokenClient(t, a, tok.SecretID)
}

// everything is the rules of a token that may do anything a Locker or a
// Store does.
const everything = `key_prefix "" { policy = "write" } session_prefix "" { policy = "write" }`

// grant creates a token of its own, and its policy, which rules allow, by
// the management client root.
func grant(t *testing.T, root *api.Client, rules string) (*api.ACLToken, *api.ACLPolicy) {
	t.Helper()
	p, _, err := root.ACL().PolicyCreate(&api.ACLPolicy{Name: "p" + strconv.FormatInt(time.Now().UnixNano(), 36), Rules: rules}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := root.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok, p
}

// TestACLRefusals: a request Consul refuses for want of rights is an
// error that says so, at once, and never reads as a lock held, free or
// released.
func TestACLRefusals(t *testing.T) {
	a, root := aclAgent(t)
	const (
		noMarkers  = everything + ` key_prefix "warden/revoked/" { policy = "deny" }`
		refusedErr = "Permission denied"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Refused at every try, a waiting acquisition went on until ctx
	// ended, and one that does not wait reported the lock held.
	t.Run("acquisition without rights to the key", func(t *testing.T) {
		readOnly := `key_prefix "" { policy = "read" } key_prefix "warden/revoked/" { policy = "write" } session_prefix "" { policy = "write" }`
		for _, c := range []struct {
			name   string
			client *api.Client
			want   string
		}{
			{"read-only token", allowed(t, a, root, readOnly), refusedErr},
			{"no session rights", allowed(t, a, root, `key_prefix "" { policy = "write" }`), refusedErr},
			{"unknown token", tokenClient(t, a, "no/such token"), "ACL not found"},
		} {
			l := lockerOn(t, c.client)
			for _, opts := range []driver.AcquireOptions{{}, {Wait: true}, {Wait: true, Fair: true}} {
				opts.TTL = MinTTL
				for what, acquire := range map[string]func(context.Context, string, driver.AcquireOptions) (driver.Lease, error){
					"Acquire": l.Acquire, "AcquireRead": l.AcquireRead,
				} {
					actx, cancel := context.WithTimeout(ctx, 10*time.Second)
					le, err := acquire(actx, name("acl-acquire"), opts)
					cancel()
					if le != nil || !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), c.want) {
						t.Errorf("%s, %s(%+v): %v; want ErrUnavailable saying %q", c.name, what, opts, err, c.want)
					}
				}
			}
		}
	})

	// A holder that could not read its markers kept its section running
	// while the lock went to another.
	t.Run("holder without rights to its markers", func(t *testing.T) {
		l := lockerOn(t, allowed(t, a, root, noMarkers))
		for _, opts := range []driver.AcquireOptions{{}, {Wait: true}} {
			opts.TTL = MinTTL
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			le, err := l.Acquire(actx, name("acl-markers"), opts)
			cancel()
			if le != nil || !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), refusedErr) || !strings.Contains(err.Error(), RevokedPrefix) {
				t.Errorf("Acquire(%+v): %v; want ErrUnavailable saying %q on %s", opts, err, refusedErr, RevokedPrefix)
			}
		}
		sessions, _, err := root.Session().List(nil)
		if err != nil || len(sessions) != 0 {
			t.Errorf("sessions left: %d, %v; want none", len(sessions), err)
		}
	})

	// A Store that could read its records but not write them sent its
	// claim again until ctx ended, and reported an abandon refused as
	// ErrNotOwner; then it answered ErrUnavailable, which an Executor
	// passes on as an outage (and httpmw's WithFailOpen served keyed
	// requests unguarded): no retry outlasts the refusal, so it is
	// ErrInvalid.
	t.Run("store without write on its records", func(t *testing.T) {
		const prefix = "warden-test/acl-store/"
		owner := storeOn(t, allowed(t, a, root, everything), WithStorePrefix(prefix))
		readOnly := storeOn(t, allowed(t, a, root, `key_prefix "" { policy = "read" } key_prefix "warden/revoked/" { policy = "write" } session_prefix "" { policy = "write" }`), WithStorePrefix(prefix))
		scope, key := "tenant", name("order")
		c := idempotency.Claim{Scope: scope, Key: key, Fingerprint: "fp", Owner: "o", Lease: time.Minute}
		if rec, err := owner.Claim(ctx, c); rec != nil || err != nil {
			t.Fatalf("Claim: %v, %v", rec, err)
		}
		enc := strings.TrimPrefix(owner.recordKey(scope, key), prefix)
		check := func(op string, err error) {
			t.Helper()
			if !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), refusedErr) || strings.Contains(err.Error(), enc) {
				t.Errorf("%s: %v; want ErrInvalid, not ErrUnavailable, saying %q, without the record's path", op, err, refusedErr)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := readOnly.Claim(cctx, idempotency.Claim{Scope: scope, Key: name("other"), Fingerprint: "fp", Owner: "o", Lease: time.Minute})
		cancel()
		check("Claim", err)
		check("Abandon", readOnly.Abandon(ctx, scope, key, "o"))
		check("Delete", readOnly.Delete(ctx, scope, key, "o"))
		check("Delete (any owner)", readOnly.Delete(ctx, scope, key, ""))
		if err := owner.Complete(ctx, scope, key, "o", []byte("done"), time.Hour); err != nil {
			t.Errorf("Complete by the owner after the refused Abandon: %v", err)
		}
	})

	// A refusal is an answer: nothing landed, and nothing is left to take
	// back (a token that cannot read the record either had the taking back
	// tried, every second, until the Store closed).
	t.Run("store without rights to its records", func(t *testing.T) {
		none := storeOn(t, allowed(t, a, root, `session_prefix "" { policy = "write" }`), WithStorePrefix("warden-test/acl-store-none/"))
		_, err := none.Claim(ctx, idempotency.Claim{Scope: "tenant", Key: name("order"), Fingerprint: "fp", Owner: "o", Lease: time.Minute})
		none.mu.Lock()
		left := len(none.claims)
		none.mu.Unlock()
		if !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), refusedErr) || left != 0 {
			t.Errorf("Claim: %v, with %d claims kept to be taken back; want the refusal (ErrInvalid, not ErrUnavailable), none kept", err, left)
		}
		_, err = none.Get(ctx, "tenant", name("order"))
		if !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), "read of the record refused") {
			t.Errorf("Get: %v; want ErrInvalid, not ErrUnavailable, saying the read was refused", err)
		}
	})

	// Nor does a refusal of the Store's session pass: ErrInvalid too.
	t.Run("store without session rights", func(t *testing.T) {
		st := storeOn(t, allowed(t, a, root, `key_prefix "" { policy = "write" }`), WithStorePrefix("warden-test/acl-store-nosession/"))
		_, err := st.Claim(ctx, idempotency.Claim{Scope: "tenant", Key: name("order"), Fingerprint: "fp", Owner: "o", Lease: time.Minute})
		if !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), refusedErr) {
			t.Errorf("Claim: %v; want ErrInvalid, not ErrUnavailable, saying %q", err, refusedErr)
		}
	})

	// A token Consul does not know may be one replaced since: the next
	// request may carry its successor, so it stays an outage.
	t.Run("store with an unknown token", func(t *testing.T) {
		st := storeOn(t, tokenClient(t, a, "no/such token"), WithStorePrefix("warden-test/acl-store-unknown/"))
		_, err := st.Claim(ctx, idempotency.Claim{Scope: "tenant", Key: name("order"), Fingerprint: "fp", Owner: "o", Lease: time.Minute})
		if !errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "ACL not found") {
			t.Errorf("Claim: %v; want ErrUnavailable saying ACL not found", err)
		}
	})

	// A Store's session holds no locks: its token needs no write on the
	// sessions' markers, which every Claim failed for.
	t.Run("store without rights to the markers", func(t *testing.T) {
		const prefix = "warden-test/acl-store-own/"
		st := storeOn(t, allowed(t, a, root, `key_prefix "`+prefix+`" { policy = "write" } session_prefix "" { policy = "write" }`), WithStorePrefix(prefix))
		scope, key := "tenant", name("order")
		if rec, err := st.Claim(ctx, idempotency.Claim{Scope: scope, Key: key, Fingerprint: "fp", Owner: "o", Lease: time.Minute}); rec != nil || err != nil {
			t.Fatalf("Claim: %v, %v", rec, err)
		}
		if err := st.Complete(ctx, scope, key, "o", []byte("done"), time.Hour); err != nil {
			t.Errorf("Complete: %v", err)
		}
	})

	// A forced release of many holders goes in batches: one refused after
	// another removed its holders returns those with the error, and guard
	// tells of them (it answered none, and logged nothing).
	t.Run("forced release refused partway", func(t *testing.T) {
		ha, hb := lockerOn(t, root), lockerOn(t, root)
		k := name("acl-force-part")
		for range maxForced {
			if _, err := ha.AcquireSemaphore(ctx, k, 100, driver.AcquireOptions{TTL: MinTTL, Owner: "A"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := hb.AcquireSemaphore(ctx, k, 100, driver.AcquireOptions{TTL: MinTTL, Owner: "B"}); err != nil {
			t.Fatal(err)
		}
		hb.mu.Lock()
		sb := hb.sessions[MinTTL].id
		hb.mu.Unlock()
		op := lockerOn(t, allowed(t, a, root, everything+` key_prefix "warden/revoked/`+sb+`/" { policy = "deny" }`))
		var logs strings.Builder
		g, err := guard.New(op, guard.WithTTL(MinTTL), guard.WithPrefix(""), guard.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		if err != nil {
			t.Fatal(err)
		}
		removed, err := g.ForceRelease(ctx, k, guard.ReleaseTarget{AnyHolder: true})
		if !errors.Is(err, guard.ErrUnavailable) || len(removed) != maxForced || !strings.Contains(logs.String(), "removed="+strconv.Itoa(maxForced)) {
			t.Errorf("ForceRelease: %d removed, %v, log %q; want the first batch's %d with the refusal, logged", len(removed), err, logs.String(), maxForced)
		}
	})

	t.Run("forced release without rights to the markers", func(t *testing.T) {
		holder := lockerOn(t, allowed(t, a, root, everything))
		op := lockerOn(t, allowed(t, a, root, noMarkers))
		k := name("acl-force")
		le, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL, Owner: "holder"})
		if err != nil {
			t.Fatal(err)
		}
		// Refused at every try, it was sent again until ctx ended.
		removed, err := op.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true})
		if !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), refusedErr) || removed != nil {
			t.Errorf("ForceRelease: %v, %v; want ErrUnavailable saying %q", removed, err, refusedErr)
		}
		if in, err := holder.Inspect(ctx, k); err != nil || len(in.Holders) != 1 || in.Holders[0].Token != le.Token() {
			t.Errorf("after the refused ForceRelease: %+v, %v; want the holder", in, err)
		}
	})
}

// TestACLChangesWhileHeld: a token deleted, or stripped of its rights,
// while its Locker holds locks or waits for one.
func TestACLChangesWhileHeld(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := driver.AcquireOptions{TTL: MinTTL}

	// The session is declared lost, its locks' work cancelled, before
	// Consul may end it, and its renewal stops; its destruction, refused,
	// was sent again every 200 ms until the Locker closed.
	t.Run("holder's token deleted", func(t *testing.T) {
		tok, _ := grant(t, root, everything)
		l := lockerOn(t, tokenClient(t, a, tok.SecretID))
		le, err := l.Acquire(ctx, name("acl-deleted"), opts)
		if err != nil {
			t.Fatal(err)
		}
		s := le.(*lease).s
		if _, err := root.ACL().TokenDelete(tok.AccessorID, nil); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		select {
		case <-s.Done():
		case <-time.After(2 * MinTTL):
			t.Fatal("the session was not declared lost")
		}
		lost := time.Since(deleted)
		if info, _, err := root.Session().Info(s.id, nil); err != nil || info == nil {
			t.Fatalf("Consul's session when its holder declared it lost: %+v, %v; want it still there", info, err)
		}
		eventually(t, 10*time.Second, "the renewal's exit, its session's destruction refused", s.exitedYet)
		t.Logf("declared lost %v after the token's deletion, Consul still having the session", lost.Round(time.Millisecond))
	})

	// A waiter whose token is deleted fails with Consul's refusal after a
	// read or two; its reads were sent again, some twenty a second, until
	// its session was declared lost.
	t.Run("waiter's token deleted", func(t *testing.T) {
		for _, fair := range []bool{false, true} {
			k := name("acl-waiter")
			held, err := lockerOn(t, root).Acquire(ctx, k, opts)
			if err != nil {
				t.Fatal(err)
			}
			tok, _ := grant(t, root, everything)
			c, reads := countedClient(t, a, tok.SecretID, func(r *http.Request) bool {
				return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/kv/")
			})
			w := lockerOn(t, c)
			done := make(chan error, 1)
			go func() {
				_, err := w.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL, Wait: true, Fair: fair})
				done <- err
			}()
			eventually(t, 10*time.Second, "the waiter queued", func() bool { return queued(t, root, k) > 0 })
			if _, err := root.ACL().TokenDelete(tok.AccessorID, nil); err != nil {
				t.Fatal(err)
			}
			before := reads.Load()
			err = <-done
			if n := reads.Load() - before; !errors.Is(err, errDenied) || n > 5 {
				t.Errorf("fair %v: %v after %d reads; want the refusal after a few", fair, err, n)
			}
			held.Release(ctx)
		}
	})

	// A release Consul refuses for good (the token lost its write on the
	// keys) is sent again until the session's loss deadline, Release
	// waiting as long, and then gives the session up, which deletes the
	// key.
	t.Run("holder's write on the keys taken", func(t *testing.T) {
		tok, p := grant(t, root, everything)
		l := lockerOn(t, tokenClient(t, a, tok.SecretID))
		k := name("acl-stripped")
		le, err := l.Acquire(ctx, k, opts)
		if err != nil {
			t.Fatal(err)
		}
		p.Rules = `key_prefix "" { policy = "read" } key_prefix "` + RevokedPrefix + `" { policy = "write" } session_prefix "" { policy = "write" }`
		if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
			t.Fatal(err)
		}
		if err := le.Release(ctx); !errors.Is(err, errDenied) {
			t.Errorf("Release: %v; want Consul's refusal", err)
		}
		eventually(t, 10*time.Second, "the key gone with the session", func() bool {
			kv, _, err := root.KV().Get(LockKey(k), nil)
			return err == nil && kv == nil
		})
	})
}

// TestReleaseRefused: a release refused for a moment (the token's policy
// loses its rights on the key, then gets them back, as a token not yet
// replicated to a secondary datacenter, or acl.down_policy, would have it)
// is sent again until Consul takes it, and the session's other lock is
// kept; so is the release of a key written over (consul kv put), whose
// read and delete Consul refuses after its first send found the key
// changed. Refused until the session's loss deadline, the session is given
// up then, which deletes the key. Either refusal gave the session up at
// once, with every lock it kept.
func TestReleaseRefused(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		writtenOver, lifted bool
	}{{false, true}, {true, true}, {true, false}} {
		tok, p := grant(t, root, everything)
		released, kept := name("refused"), name("refused-other")
		refuse := func() {
			p.Rules = everything + ` key "` + LockKey(released) + `" { policy = "read" }`
			if c.writtenOver {
				p.Rules = everything + ` key "` + LockKey(released) + `" { policy = "deny" }`
			}
			if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
				t.Error(err)
			}
		}
		var armed atomic.Bool
		l := lockerOn(t, clientThrough(t, a, tok.SecretID, func(base http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := base.RoundTrip(r)
				if err == nil && r.URL.Path == "/v1/txn" && resp.StatusCode == http.StatusConflict && armed.CompareAndSwap(true, false) {
					refuse() // the release's check failed: the key was written over
				}
				return resp, err
			})
		}))
		opts := driver.AcquireOptions{TTL: MinTTL}
		le, err := l.Acquire(ctx, released, opts)
		if err != nil {
			t.Fatal(err)
		}
		other, err := l.Acquire(ctx, kept, opts)
		if err != nil {
			t.Fatal(err)
		}
		if c.writtenOver {
			if _, err := root.KV().Put(&api.KVPair{Key: LockKey(released), Value: []byte("an operator's")}, nil); err != nil {
				t.Fatal(err)
			}
			armed.Store(true)
		} else {
			refuse()
		}
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		err = le.Release(rctx)
		rcancel()
		if !errors.Is(err, errDenied) || armed.Load() {
			t.Errorf("%+v: Release while refused: %v (refused after a send found the key changed: %v); want Consul's refusal", c, err, !armed.Load())
		}
		if c.lifted {
			p.Rules = everything
			if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, 2*MinTTL, "the released key gone", func() bool {
			kv, _, err := root.KV().Get(LockKey(released), nil)
			return err == nil && kv == nil
		})
		if s := other.(*lease).s; s.lost() == c.lifted {
			t.Errorf("%+v: the session's other lock lost: %v", c, s.lost())
		}
	}
}

// TestAcquisitionRefusedForAMoment: an acquisition transaction refused
// outright (HTTP 403: a token Consul does not know for a moment, as one
// not yet replicated to a secondary datacenter) applied nothing, and is
// reported as Consul's refusal; it costs the Locker's other locks
// nothing. The client's Txn gives such an answer without its status: it
// read as an outage, and the session was given up with the lock it held.
// A Store's claim is refused alike.
func TestAcquisitionRefusedForAMoment(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tok, _ := grant(t, root, everything)
	c := tokenClient(t, a, tok.SecretID)
	l := lockerOn(t, c)
	st := storeOn(t, c)
	opts := driver.AcquireOptions{TTL: MinTTL}
	held, err := l.Acquire(ctx, name("refused-acquisition-held"), opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, idempotency.Claim{Scope: "tenant", Key: name("first"), Fingerprint: "fp", Owner: "o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := root.ACL().TokenDelete(tok.AccessorID, nil); err != nil {
		t.Fatal(err)
	}
	for what, acquire := range acquirers(l) {
		if le, err := acquire(ctx, name("refused-acquisition"), opts); !errors.Is(err, errDenied) {
			t.Errorf("%s with the token unknown: %v, %v; want Consul's refusal", what, le, err)
		}
	}
	_, err = st.Claim(ctx, idempotency.Claim{Scope: "tenant", Key: name("second"), Fingerprint: "fp", Owner: "o", Lease: time.Minute})
	if !errors.Is(err, errDenied) {
		t.Errorf("Claim with the token unknown: %v; want Consul's refusal", err)
	}
	if s := held.(*lease).s; s.lost() {
		t.Error("the held lock's session was given up for a refused acquisition")
	}
}

// TestInspectOfWithheldKeys: a token that may not read a name's keys, which
// the ACL leaves out of its reads, is told that Inspect cannot say whether
// the name is held, rather than that it is free, and that List's page is
// partial; a name it may read is inspected and listed as ever.
func TestInspectOfWithheldKeys(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := lockerOn(t, allowed(t, a, root, everything))
	open, withheld := name("acl-open"), name("acl-withheld")
	for _, k := range []string{open, withheld} {
		if _, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL}); err != nil {
			t.Fatal(err)
		}
	}
	l := lockerOn(t, allowed(t, a, root, `key_prefix "" { policy = "read" } key_prefix "`+url.PathEscape(withheld)+`." { policy = "deny" } session_prefix "" { policy = "read" }`))
	if in, err := l.Inspect(ctx, withheld); !errors.Is(err, errDenied) || !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("Inspect of a name whose keys the token may not read: %+v, %v; want an error wrapping driver.ErrUnavailable, for want of ACL rights", in, err)
	}
	if in, err := l.Inspect(ctx, open); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect of a name the token may read: %+v, %v; want its holder", in, err)
	}
	// A page cannot name what was left out of its read, but comes with
	// ErrPartialList.
	page, err := l.List(ctx, testPrefix, "", 100)
	if !errors.Is(err, driver.ErrPartialList) || len(page) != 1 || page[0].Key != open || len(page[0].Holders) != 1 {
		t.Errorf("List: %+v, %v; want %q held, with driver.ErrPartialList", page, err, open)
	}
}

// TestInspectOfWithheldDotName: the name ".", whose keys' prefix ".." a
// URL cannot name, is not read as free, nor found with nothing to
// release, nor left out of a page said to be whole, by a token that may
// not read its keys; a token denied a key elsewhere reads it.
func TestInspectOfWithheldDotName(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := lockerOn(t, allowed(t, a, root, everything))
	if _, err := holder.Acquire(ctx, ".", driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Fatal(err)
	}
	if in, err := holder.Inspect(ctx, "."); err != nil || len(in.Holders) != 1 {
		t.Fatalf("the holder's Inspect of \".\": %+v, %v; want its holder", in, err)
	}
	l := lockerOn(t, allowed(t, a, root, `key_prefix "" { policy = "read" } key_prefix ".." { policy = "deny" } session_prefix "" { policy = "read" }`))
	if in, err := l.Inspect(ctx, "."); !errors.Is(err, errDenied) || !errors.Is(err, driver.ErrUnavailable) {
		t.Errorf("Inspect of \".\", whose keys the token may not read: %+v, %v; want an error wrapping driver.ErrUnavailable, for want of ACL rights", in, err)
	}
	if rm, err := l.ForceRelease(ctx, ".", driver.ReleaseTarget{AnyHolder: true}); !errors.Is(err, errDenied) {
		t.Errorf("ForceRelease of \".\", whose keys the token may not read: %v, %v; want an error for want of ACL rights", rm, err)
	}
	if in, err := holder.Inspect(ctx, "."); err != nil || len(in.Holders) != 1 {
		t.Errorf("the holder's Inspect of \".\" after: %+v, %v; want its holder", in, err)
	}
	// List of the prefix ".", whose read a transaction would filter without
	// a word, says that its page is partial, and whole to the holder.
	if page, err := l.List(ctx, ".", "", 100); !errors.Is(err, driver.ErrPartialList) {
		t.Errorf("List(\".\") by a token that may not read its keys: %+v, %v; want driver.ErrPartialList", page, err)
	}
	if page, err := holder.List(ctx, ".", "", 100); err != nil || len(page) != 1 || page[0].Key != "." {
		t.Errorf("the holder's List(\".\"): %+v, %v; want \".\" held, whole", page, err)
	}
	// A key elsewhere that the token may not read is not the name's.
	elsewhere := name("elsewhere")
	if _, err := holder.Acquire(ctx, elsewhere, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Fatal(err)
	}
	l = lockerOn(t, allowed(t, a, root, `key_prefix "" { policy = "read" } key_prefix "`+url.PathEscape(elsewhere)+`." { policy = "deny" } session_prefix "" { policy = "read" }`))
	if in, err := l.Inspect(ctx, "."); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect of \".\" by a token denied a key elsewhere: %+v, %v; want its holder", in, err)
	}
}

// TestAnonymousReadsAreFiltered: Consul filters what a request without a
// token (the anonymous token's) may not read without saying so; under the
// default policy deny, such a reader is not shown a held lock as free nor
// left out of a page said to be whole. A token allowed to read everything
// is told of no keys left out.
func TestAnonymousReadsAreFiltered(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := lockerOn(t, allowed(t, a, root, everything))
	k := name("anonymous")
	if _, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Fatal(err)
	}
	anon := lockerOn(t, tokenClient(t, a, ""))
	if in, err := anon.Inspect(ctx, k); !errors.Is(err, errDenied) {
		t.Errorf("Inspect without a token: %+v, %v; want an error for want of ACL rights", in, err)
	}
	if rm, err := anon.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); !errors.Is(err, errDenied) {
		t.Errorf("ForceRelease without a token: %v, %v; want an error for want of ACL rights", rm, err)
	}
	if page, err := anon.List(ctx, testPrefix, "", 100); !errors.Is(err, driver.ErrPartialList) {
		t.Errorf("List without a token: %+v, %v; want driver.ErrPartialList", page, err)
	}
	reader := lockerOn(t, allowed(t, a, root, `key_prefix "" { policy = "read" } session_prefix "" { policy = "read" }`))
	if in, err := reader.Inspect(ctx, k); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect with a token that may read everything: %+v, %v; want its holder", in, err)
	}
	if page, err := reader.List(ctx, testPrefix, "", 100); err != nil || len(page) != 1 || page[0].Key != k {
		t.Errorf("List with a token that may read everything: %+v, %v; want %q alone, whole", page, err, k)
	}
}

// TestPartialPageJudgesNoSharedLock: on a page the ACL left keys out of,
// a read/write lock some of whose contenders may be missing is listed as
// one that could not be read, not as held by whom the keys read show: here
// its writer's key is left out, which read its waiting reader as holding.
func TestPartialPageJudgesNoSharedLock(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	writer, reader := lockerOn(t, allowed(t, a, root, everything)), lockerOn(t, allowed(t, a, root, everything))
	k := name("rwx")
	if _, err := writer.AcquireWrite(ctx, k, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Fatal(err)
	}
	keys, _, err := root.KV().Keys(RWDir(k), "", nil)
	if err != nil || len(keys) != 1 {
		t.Fatalf("the writer's key: %q, %v", keys, err)
	}
	wctx, stop := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := reader.AcquireRead(wctx, k, driver.AcquireOptions{TTL: MinTTL, Wait: true})
		waited <- err
	}()
	defer func() {
		stop()
		<-waited
	}()
	for {
		if ks, _, err := root.KV().Keys(RWDir(k), "", nil); err == nil && len(ks) == 2 {
			break
		}
		select {
		case err := <-waited:
			t.Fatalf("the reader did not wait: %v", err)
		case <-ctx.Done():
			t.Fatal("the reader did not queue within a minute")
		case <-time.After(20 * time.Millisecond):
		}
	}
	l := lockerOn(t, allowed(t, a, root, `key_prefix "" { policy = "read" } key "`+keys[0]+`" { policy = "deny" } session_prefix "" { policy = "read" }`))
	page, err := l.List(ctx, testPrefix, "", 100)
	if !errors.Is(err, driver.ErrPartialList) || len(page) != 1 || page[0].Key != k || !errors.Is(page[0].Err, errDenied) || len(page[0].Holders) != 0 {
		t.Errorf("List: %+v, %v; want %q unread, for want of ACL rights, with driver.ErrPartialList", page, err, k)
	}
}

// TestFilteredContendersRefuse: a token that may write every key but an
// earlier contender's is not granted a read/write lock or a semaphore that
// contender holds, though the read it judges from leaves its key out: it
// is refused at once, for want of ACL rights. So is a client without a
// token under the default policy deny, whose reads Consul filters without
// saying so.
func TestFilteredContendersRefuse(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := lockerOn(t, allowed(t, a, root, everything))
	rw, sem := name("filtered-rw"), name("filtered-sem")
	if _, err := holder.AcquireWrite(ctx, rw, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.AcquireSemaphore(ctx, sem, 1, driver.AcquireOptions{TTL: MinTTL}); err != nil {
		t.Fatal(err)
	}
	// The holders' keys, each denied by an exact rule.
	rules := everything
	for _, dir := range []string{RWDir(rw), SemaphoreDir(sem)} {
		keys, _, err := root.KV().Keys(dir, "", nil)
		if err != nil || len(keys) != 1 {
			t.Fatalf("the keys under %q: %q, %v", dir, keys, err)
		}
		rules += ` key "` + keys[0] + `" { policy = "deny" }`
	}
	tok := allowAnonymous(t, root, rules)
	for _, c := range []struct {
		who    string
		client *api.Client
	}{{"a token", tokenClient(t, a, tok.SecretID)}, {"no token", tokenClient(t, a, "")}} {
		l := lockerOn(t, c.client)
		for _, wait := range []bool{false, true} {
			opts := driver.AcquireOptions{TTL: MinTTL, Wait: wait}
			if le, err := l.AcquireRead(ctx, rw, opts); !errors.Is(err, errDenied) {
				t.Errorf("%s, wait %v: AcquireRead while its writer's key is hidden: %v, %v; want an error for want of ACL rights", c.who, wait, le, err)
			}
			if le, err := l.AcquireSemaphore(ctx, sem, 1, opts); !errors.Is(err, errDenied) {
				t.Errorf("%s, wait %v: AcquireSemaphore of 1 while its holder's key is hidden: %v, %v; want an error for want of ACL rights", c.who, wait, le, err)
			}
		}
	}
}

// TestPurgeFilteredDeletesNothing: Purge by a token that may not read one
// record, whose chunks it may read, fails for want of ACL rights rather
// than take the chunks for no record's and delete them.
func TestPurgeFilteredDeletesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner, others := claimedRecord(ctx, t)
	response := bytes.Repeat([]byte{1}, inlineResponse+1) // in chunks
	if err := owner.Complete(ctx, "", "k", "o", response, time.Hour); err != nil {
		t.Fatal(err)
	}
	purger := others(` key "` + owner.recordKey("", "k") + `" { policy = "deny" }`)
	if n, err := purger.Purge(ctx); !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrUnavailable) || !strings.Contains(err.Error(), "ACL rights") {
		t.Errorf("Purge by a token denied a record: (%d, %v); want ErrInvalid, not ErrUnavailable, for want of ACL rights", n, err)
	}
	if rec, err := owner.Get(ctx, "", "k"); err != nil || !bytes.Equal(rec.Response, response) {
		t.Errorf("the record after Purge: %v; want it whole", err)
	}
}

// TestDeleteHiddenRecord: Delete naming an owner, by a token that may not
// read the record, fails for want of ACL rights, not as a record absent:
// Consul's transaction leaves the record out of its read without a word.
func TestDeleteHiddenRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner, others := claimedRecord(ctx, t)
	denied := others(` key "` + owner.recordKey("", "k") + `" { policy = "deny" }`)
	if err := denied.Delete(ctx, "", "k", "o"); !errors.Is(err, idempotency.ErrInvalid) || errors.Is(err, idempotency.ErrUnavailable) ||
		!errors.Is(err, driver.ErrNotSent) || !strings.Contains(err.Error(), "ACL rights") {
		t.Errorf("Delete by a token that may not read the record: %v; want ErrInvalid, not ErrUnavailable, for want of ACL rights, marked not sent", err)
	}
}

// claimedRecord starts an ACL agent of the test's own (aclAgent) and
// returns a Store there with every right, under a prefix of its own, that
// holds the claim of the key "k" by "o", and a function that returns
// another Store under that prefix whose token has every right but what
// the rules it is given add.
func claimedRecord(ctx context.Context, t *testing.T) (*Store, func(rules string) *Store) {
	t.Helper()
	a, root := aclAgent(t)
	prefix := fmt.Sprintf("%sacl-%d/", storePrefix, time.Now().UnixNano())
	owner := storeOn(t, allowed(t, a, root, everything), WithStorePrefix(prefix))
	if rec, err := owner.Claim(ctx, idempotency.Claim{Key: "k", Owner: "o", Lease: time.Minute}); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	return owner, func(rules string) *Store {
		return storeOn(t, allowed(t, a, root, everything+rules), WithStorePrefix(prefix))
	}
}

// allowAnonymous grants the anonymous token, which requests without a
// token of their own carry, a policy that rules allow, and returns a new
// token of that policy alone.
func allowAnonymous(t *testing.T, root *api.Client, rules string) *api.ACLToken {
	t.Helper()
	tok, p := grant(t, root, rules)
	const anonymousID = "00000000-0000-0000-0000-000000000002"
	anon, _, err := root.ACL().TokenRead(anonymousID, nil)
	if err != nil {
		t.Fatal(err)
	}
	anon.Policies = append(anon.Policies, &api.ACLTokenPolicyLink{ID: p.ID})
	if _, _, err := root.ACL().TokenUpdate(anon, nil); err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestAnonymousWaitsInQueue: a client without a token, under the default
// policy deny, whose reads Consul may filter without a word, still waits
// in a lock's queue behind another waiter and is granted the lock once
// free: the queue only orders the waiters, and the lock key's transaction
// judges the key itself.
func TestAnonymousWaitsInQueue(t *testing.T) {
	a, root := aclAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	allowAnonymous(t, root, everything)
	holder, first := lockerOn(t, allowed(t, a, root, everything)), lockerOn(t, allowed(t, a, root, everything))
	anon := lockerOn(t, tokenClient(t, a, ""))
	k := name("anonymous-queue")
	opts := driver.AcquireOptions{TTL: MinTTL, Wait: true, Fair: true}
	held, err := holder.Acquire(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	firstDone := make(chan error, 1)
	go func() {
		le, err := first.Acquire(ctx, k, opts)
		if err == nil {
			err = le.Release(ctx)
		}
		firstDone <- err
	}()
	eventually(t, 10*time.Second, "the first waiter queued", func() bool { return queued(t, root, k) == 1 })
	anonDone := make(chan error, 1)
	go func() {
		le, err := anon.Acquire(ctx, k, opts)
		if err == nil {
			err = le.Release(ctx)
		}
		anonDone <- err
	}()
	eventually(t, 10*time.Second, "the anonymous waiter queued", func() bool { return queued(t, root, k) == 2 })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-firstDone; err != nil {
		t.Errorf("the first waiter: %v", err)
	}
	if err := <-anonDone; err != nil {
		t.Errorf("the waiter without a token: %v; want the lock once free", err)
	}
}

package consullock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// anchorAcquisition reports whether r acquires a session's anchor.
func anchorAcquisition(r *http.Request) bool {
	return r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/kv/"+RevokedPrefix) && r.URL.Query().Has("acquire")
}

// anchorFailing returns a client of its own to a, with token, the number of
// marker reads it has sent, and a switch: once set, the next acquisition
// of a session's anchor fails without an answer (as in a leader election),
// and the switch is cleared.
func anchorFailing(t *testing.T, a, token string) (c *api.Client, watches *atomic.Int64, fail *atomic.Bool) {
	watches, fail = new(atomic.Int64), new(atomic.Bool)
	c = clientThrough(t, a, token, func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if markerRead(r) {
				watches.Add(1)
			}
			if anchorAcquisition(r) && fail.CompareAndSwap(true, false) {
				return nil, errors.New("no answer")
			}
			return base.RoundTrip(r)
		})
	})
	return c, watches, fail
}

// TestAnchorAcquiredAgainAfterAFailure: the anchor, left out of a read of
// the markers, is acquired again until Consul answers, though the first
// attempt gets no answer. Without a token, the read on RevokedPrefix taken
// away, the attempt after it is refused, and the session given up before
// the forced release; with one, an anchor deleted by an operator is back.
// The failed attempt left the session unanchored for its life: the holder
// without a token worked on, the lock held twice, and the deleted anchor
// stayed gone.
func TestAnchorAcquiredAgainAfterAFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, root := aclAgent(t)

	t.Run("without a token, RevokedPrefix denied", func(t *testing.T) {
		tok := allowAnonymous(t, root, everything)
		p, _, err := root.ACL().PolicyRead(tok.Policies[0].ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, watches, fail := anchorFailing(t, a, "")
		heldTwiceThrough(ctx, t, root, c, watches, func(*lease) {
			p.Rules = everything + ` key_prefix "` + RevokedPrefix + `" { policy = "deny" }`
			if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
				t.Fatal(err)
			}
			fail.Store(true)
		})
		if fail.Load() {
			t.Error("the anchor was not acquired again")
		}
	})

	t.Run("the anchor deleted", func(t *testing.T) {
		tok, _ := grant(t, root, everything)
		c, watches, fail := anchorFailing(t, a, tok.SecretID)
		le, err := lockerOn(t, c).Acquire(ctx, name("anchor-deleted"), driver.AcquireOptions{TTL: MinTTL})
		if err != nil {
			t.Fatal(err)
		}
		s := le.(*lease).s
		eventually(t, 10*time.Second, "the marker query waiting", func() bool { return watches.Load() >= 2 })
		fail.Store(true)
		if _, err := root.KV().Delete(revokedDir(s.id), nil); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the anchor acquired again", func() bool {
			kv, _, err := root.KV().Get(revokedDir(s.id), nil)
			return err == nil && kv != nil && kv.Session == s.id
		})
		if fail.Load() || s.lost() {
			t.Errorf("the first attempt failed: %v; the session lost: %v", !fail.Load(), s.lost())
		}
	})
}

// holdTwo has a Locker on c, with opts, acquire two locks, and returns the
// name of the first, its lease, and a channel closed when the lease is
// revoked, once the session's query on its markers, counted by watches,
// waits.
func holdTwo(ctx context.Context, t *testing.T, c *api.Client, watches *atomic.Int64, opts ...Option) (string, *lease, <-chan struct{}) {
	t.Helper()
	l := lockerOn(t, c, opts...)
	ao := driver.AcquireOptions{TTL: MinTTL}
	k := name("held")
	le, err := l.Acquire(ctx, k, ao)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, name("held-other"), ao); err != nil {
		t.Fatal(err)
	}
	held := le.(*lease)
	revoked := make(chan struct{})
	held.OnRevoke(func() { close(revoked) })
	// The first query reads the directory, the second waits.
	eventually(t, 10*time.Second, "the marker query waiting", func() bool { return watches.Load() >= 2 })
	return k, held, revoked
}

// TestMarkerReadRefusedForAMoment: the holder's token is unknown to Consul
// for a moment (deleted and created again with the same secret, as a
// secondary datacenter's servers may not know a token yet), while its
// session's query on its markers is sent again: the session keeps its
// locks, and a forced release of one, once the token is back, is
// reported. The session, and both its locks, were given up at the first
// refused read.
func TestMarkerReadRefusedForAMoment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, root := aclAgent(t)
	tok, _ := grant(t, root, everything)
	var watches, refused atomic.Int64
	c := clientThrough(t, a, tok.SecretID, func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if !markerRead(r) {
				return base.RoundTrip(r)
			}
			watches.Add(1)
			resp, err := base.RoundTrip(r)
			if err == nil && resp.StatusCode == http.StatusForbidden {
				refused.Add(1)
			}
			return resp, err
		})
	})
	k, held, revoked := holdTwo(ctx, t, c, &watches)
	if _, err := root.ACL().TokenDelete(tok.AccessorID, nil); err != nil {
		t.Fatal(err)
	}
	wake(t, root, held.s, &watches)
	eventually(t, 10*time.Second, "a marker read refused", func() bool { return refused.Load() > 0 || held.s.lost() })
	if _, _, err := root.ACL().TokenCreate(&api.ACLToken{AccessorID: tok.AccessorID, SecretID: tok.SecretID, Policies: tok.Policies}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := lockerOn(t, root).ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-revoked:
	case <-held.s.Done():
		t.Fatal("the session, and both its locks, given up for a refusal of a moment")
	case <-time.After(10 * time.Second):
		t.Fatal("the forced release not reported")
	}
	if held.s.lost() {
		t.Error("the session, and its other lock, lost")
	}
}

// TestSeenMarkerHiddenAfter: a rule naming a marker, added after the
// holder's query on its markers read it (the lease revoked) and before
// the marker's delete (as one added while the query waits is, since
// Consul judges the query by the rules as they were when it came), refuses
// that delete and hides the marker from the reads after. With nothing
// else written under the session's directory, those reads, filtered, keep
// the session and its other lock; they gave the session up. After a write
// there, a filtered read gives it up: it cannot tell what it hides from
// the marker.
func TestSeenMarkerHiddenAfter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, root := aclAgent(t)
	tok, p := grant(t, root, everything)
	var watches, filtered atomic.Int64
	var hide sync.Once
	c := clientThrough(t, a, tok.SecretID, func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			switch {
			case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/kv/"+RevokedPrefix):
				hide.Do(func() {
					p.Rules = everything + ` key "` + strings.TrimPrefix(r.URL.Path, "/v1/kv/") + `" { policy = "deny" }`
					if _, _, err := root.ACL().PolicyUpdate(p, nil); err != nil {
						t.Error(err)
					}
				})
			case markerRead(r):
				watches.Add(1)
				// The query sent again after its wait, in a moment
				// rather than in minutes.
				r = r.Clone(r.Context())
				q := r.URL.Query()
				q.Set("wait", "100ms")
				r.URL.RawQuery = q.Encode()
			}
			resp, err := base.RoundTrip(r)
			if err == nil && resp.Header.Get("X-Consul-Results-Filtered-By-Acls") == "true" {
				filtered.Add(1)
			}
			return resp, err
		})
	})
	k, held, revoked := holdTwo(ctx, t, c, &watches)
	if _, err := lockerOn(t, root).ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-revoked:
	case <-held.s.Done():
		t.Fatal("the session given up before the marker was seen")
	case <-time.After(10 * time.Second):
		t.Fatal("the forced release not reported")
	}
	eventually(t, 10*time.Second, "two reads filtered", func() bool { return filtered.Load() >= 2 || held.s.lost() })
	if held.s.lost() {
		t.Fatal("the session, with its other lock, given up for a marker already seen")
	}
	wake(t, root, held.s, &watches)
	eventually(t, 10*time.Second, "the session given up after a write under its directory", held.s.lost)
}

// TestMarkersUnreadForGood: a holder whose marker reads fail for good
// without a refusal (answered 500, while its renewals go through), or
// whose anchor, deleted, cannot be acquired again (answered 500: no
// marker is read meanwhile), did not learn of a forced release while its
// session lived: its session is given up by its loss deadline as of the
// first failure, nine tenths of the TTL after it.
func TestMarkersUnreadForGood(t *testing.T) {
	for _, c := range []struct {
		name  string
		fault func(*http.Request) bool
		begin func(t *testing.T, s *session, root *api.Client, watches, faults *atomic.Int64)
	}{
		{"reads answered 500", markerRead, func(t *testing.T, s *session, root *api.Client, watches, _ *atomic.Int64) {
			// The query waiting unfaulted returns; the next are faulted.
			wake(t, root, s, watches)
			wake(t, root, s, watches)
		}},
		{"anchor answered 500", anchorAcquisition, func(t *testing.T, s *session, root *api.Client, _, faults *atomic.Int64) {
			if _, err := root.KV().Delete(revokedDir(s.id), nil); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "the watcher acquires the anchor again", func() bool { return faults.Load() > 0 })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			a, root := aclAgent(t)
			tok, _ := grant(t, root, everything)
			var on atomic.Bool
			var watches, faults atomic.Int64
			client := clientThrough(t, a, tok.SecretID, func(base http.RoundTripper) http.RoundTripper {
				return roundTripFunc(func(r *http.Request) (*http.Response, error) {
					if markerRead(r) {
						watches.Add(1)
					}
					if on.Load() && c.fault(r) {
						faults.Add(1)
						return answered(r, http.StatusInternalServerError, "rpc error"), nil
					}
					return base.RoundTrip(r)
				})
			})
			k, held, revoked := holdTwo(ctx, t, client, &watches)
			on.Store(true)
			c.begin(t, held.s, root, &watches, &faults)
			if _, err := lockerOn(t, root).ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			select {
			case <-revoked:
			case <-held.s.Done():
			case <-time.After(2 * MinTTL):
				// Due 0.9 TTL after the first failure, before the release:
				// the room is for a loaded machine.
				t.Errorf("the holder not told within two TTLs of a forced release, its session alive")
			}
			t.Logf("the holder told or its session ended %v after the forced release", time.Since(start).Round(time.Millisecond))
		})
	}
}

// answered is the answer to r of a server, or a proxy, that says status
// and why.
func answered(r *http.Request, status int, why string) *http.Response {
	return &http.Response{StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader(why)), Request: r}
}

// cancelOnClose is a response body whose Close ends its request's context.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// TestCutQueriesKeepTheSession: the holder reaches Consul through a proxy
// that answers 504 to a request it has had no answer to within a few
// seconds (a route timeout, Envoy's 15 s by default), so every marker
// query that waits is cut; nothing else fails. The markers stay readable:
// the session keeps its locks, and a forced release of one is reported
// within a cut. The session was given up at the first cut past its loss
// deadline as of the first, since the read after each was a query that
// waited to be cut too, and no read cleared that deadline.
func TestCutQueriesKeepTheSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const cutAfter = 2 * time.Second
	var watches, cuts atomic.Int64
	c := clientThrough(t, addr(t), "", func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if !markerRead(r) {
				return base.RoundTrip(r)
			}
			watches.Add(1)
			rctx, cancel := context.WithTimeout(r.Context(), cutAfter)
			resp, err := base.RoundTrip(r.WithContext(rctx))
			if err != nil {
				cancel()
				if r.Context().Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
					cuts.Add(1)
					return answered(r, http.StatusGatewayTimeout, "upstream request timeout"), nil
				}
				return nil, err
			}
			resp.Body = cancelOnClose{resp.Body, cancel}
			return resp, nil
		})
	})
	k, held, revoked := holdTwo(ctx, t, c, &watches)
	// Two TTLs: the session would have been given up within one.
	select {
	case <-held.s.Done():
		t.Fatalf("the session given up after %d cut queries, its markers readable all along", cuts.Load())
	case <-time.After(2 * MinTTL):
	}
	if cuts.Load() < 3 {
		t.Fatalf("%d marker queries cut in two TTLs; want more", cuts.Load())
	}
	if _, err := lockerOn(t, newClient(t, addr(t))).ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-revoked:
	case <-time.After(cutAfter + 5*time.Second):
		t.Errorf("a forced release not reported within a cut and 5 s, %d queries cut", cuts.Load())
	}
}

// TestAnchorThenReadsUnread: the holder's anchor is deleted, and a forced
// release made; the anchor's acquisitions fail (answered 500) until just
// before the session's loss deadline as of the read that found it gone,
// and are granted then, and every marker read fails from then on. The
// holder reads no marker all along, so its session is given up at that
// deadline, nine tenths of a TTL after the forced release. The deadline
// started again at the first failed read after the anchor came back: 1.57
// TTLs.
func TestAnchorThenReadsUnread(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var watches, anchorFaults atomic.Int64
	var switchAt atomic.Int64 // unix ns: the anchor granted, and reads failing, from then; 0 before the faults
	c := clientThrough(t, addr(t), "", func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			at := switchAt.Load()
			after := at != 0 && time.Now().UnixNano() >= at
			if markerRead(r) {
				watches.Add(1)
				if after {
					return answered(r, http.StatusInternalServerError, "rpc error"), nil
				}
			}
			if anchorAcquisition(r) && at != 0 && !after {
				anchorFaults.Add(1)
				return answered(r, http.StatusInternalServerError, "rpc error"), nil
			}
			return base.RoundTrip(r)
		})
	})
	k, held, revoked := holdTwo(ctx, t, c, &watches)
	s := held.s
	switchAt.Store(s.Expiry().Add(-s.margin() - 400*time.Millisecond).UnixNano())
	root := newClient(t, addr(t))
	if _, err := root.KV().Delete(revokedDir(s.id), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the anchor acquired again, and failing", func() bool { return anchorFaults.Load() > 0 })
	if _, err := lockerOn(t, root).ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case <-revoked:
	case <-s.Done():
	case <-time.After(3 * MinTTL):
		t.Fatal("the holder not told within three TTLs of a forced release, its session alive")
	}
	// Due 0.9 TTL after the forced release at the latest; the room is for
	// a loaded machine.
	if d := time.Since(start); d > MinTTL+2*time.Second {
		t.Errorf("the holder worked on %v (%.2f TTLs) after a forced release it could not read", d.Round(time.Millisecond), float64(d)/float64(MinTTL))
	}
}

// TestStoreAnchorBackAfterLongOutage: a Store's anchor is deleted, and its
// acquisitions fail (answered 500) for longer than the TTL, as through a
// long election: the Store's session, which holds no locks, is kept, and
// acquires its anchor once Consul answers. It gave the anchor up for the
// rest of its life at its loss deadline.
func TestStoreAnchorBackAfterLongOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var watches, faults atomic.Int64
	var until atomic.Int64 // unix ns: the acquisitions fail until then
	c := clientThrough(t, addr(t), "", func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if markerRead(r) {
				watches.Add(1)
			}
			if anchorAcquisition(r) && time.Now().UnixNano() < until.Load() {
				faults.Add(1)
				return answered(r, http.StatusInternalServerError, "rpc error"), nil
			}
			return base.RoundTrip(r)
		})
	})
	_, s := claimingStore(ctx, t, c, "outage", &watches)
	end := time.Now().Add(MinTTL + time.Second)
	until.Store(end.UnixNano())
	root := newClient(t, addr(t))
	if _, err := root.KV().Delete(revokedDir(s.id), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the anchor acquired again, and failing", func() bool { return faults.Load() > 0 })
	// The anchor cannot be back before end.
	eventually(t, time.Until(end)+10*time.Second, "the anchor acquired once Consul answers", func() bool {
		kv, _, err := root.KV().Get(revokedDir(s.id), nil)
		return err == nil && kv != nil && kv.Session == s.id
	})
	if s.lost() {
		t.Error("the Store's session given up")
	}
}

// TestUnansweredPastDeadline: a holder whose Locker waits long for an
// answer (a request timeout of 20 s) reads no marker, since its reads, or
// its anchor's acquisitions, get no answer at all, after a first read
// answered 500, or after its anchor was deleted; a forced release is made
// meanwhile. Its session is given up at its loss deadline, 0.9 TTL after
// the failure. The deadline was looked at only once a request came back,
// so the holder worked on until the request timeout: 2.02 TTLs.
func TestUnansweredPastDeadline(t *testing.T) {
	for _, c := range []struct {
		name string
		hang func(*http.Request) bool
		fail func(t *testing.T, root *api.Client, s *session, watches *atomic.Int64, failing *atomic.Bool)
	}{
		{"reads", markerRead, func(t *testing.T, root *api.Client, s *session, watches *atomic.Int64, failing *atomic.Bool) {
			failing.Store(true)
			wake(t, root, s, watches)
		}},
		{"anchor", anchorAcquisition, func(t *testing.T, root *api.Client, s *session, _ *atomic.Int64, _ *atomic.Bool) {
			if _, err := root.KV().Delete(revokedDir(s.id), nil); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var watches, hung atomic.Int64
			// failing: the next marker read is answered 500 (and
			// failing cleared); hanging: every request c.hang picks
			// gets no answer.
			var failing, hanging atomic.Bool
			client := clientThrough(t, addr(t), "", func(base http.RoundTripper) http.RoundTripper {
				return roundTripFunc(func(r *http.Request) (*http.Response, error) {
					if markerRead(r) {
						watches.Add(1)
						if failing.CompareAndSwap(true, false) {
							return answered(r, http.StatusInternalServerError, "rpc error"), nil
						}
					}
					if hanging.Load() && c.hang(r) {
						hung.Add(1)
						<-r.Context().Done()
						return nil, r.Context().Err()
					}
					return base.RoundTrip(r)
				})
			})
			k, held, revoked := holdTwo(ctx, t, client, &watches, WithRequestTimeout(20*time.Second))
			root := newClient(t, addr(t))
			hanging.Store(true)
			start := time.Now()
			c.fail(t, root, held.s, &watches, &failing)
			eventually(t, 10*time.Second, "a request without an answer", func() bool { return hung.Load() > 0 })
			if _, err := lockerOn(t, root).ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-revoked:
			case <-held.s.Done():
			case <-time.After(3 * MinTTL):
				t.Fatal("the holder not told within three TTLs of a forced release, its session alive")
			}
			// Due 0.9 TTL after the failure; the room is for a loaded
			// machine.
			if d := time.Since(start); d > MinTTL+2*time.Second {
				t.Errorf("the holder worked on %v (%.2f TTLs) after its reads failed, %d requests unanswered", d.Round(time.Millisecond), float64(d)/float64(MinTTL), hung.Load())
			}
		})
	}
}

// TestWatchCutSilently: the session's blocking query on its markers goes
// through a proxy that, once the query waits, forwards nothing more either
// way and keeps the connection open, as a NAT or a firewall that drops an
// idle long poll without a reset does; every other request, the read sent
// after a failed query included, reaches Consul on a connection of its
// own. A forced release is made meanwhile: the holder is told of it by its
// marker, within its renewal period of it, its session kept. The holder
// was told only when the query's bound ran out, over five minutes later.
func TestWatchCutSilently(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := addr(t)
	p := drivertest.StartProxy(t, a)
	// watches counts every marker read, queries counts those that wait.
	var watches, queries atomic.Int64
	c := clientThrough(t, a, "", func(base http.RoundTripper) http.RoundTripper {
		proxied := base.(*http.Transport).Clone()
		proxied.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, p.Addr())
		}
		t.Cleanup(proxied.CloseIdleConnections)
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if !markerRead(r) {
				return base.RoundTrip(r)
			}
			watches.Add(1)
			if r.URL.Query().Has("index") {
				queries.Add(1)
				return proxied.RoundTrip(r)
			}
			return base.RoundTrip(r)
		})
	})
	k, held, revoked := holdTwo(ctx, t, c, &watches)
	p.Blackhole()
	if _, err := lockerOn(t, newClient(t, a)).ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// The room past the renewal period is for a loaded machine.
	within := held.s.ttl/3 + 2*time.Second
	select {
	case <-revoked:
		t.Logf("told %v after the forced release, %d blocking queries sent", time.Since(start).Round(time.Millisecond), queries.Load())
	case <-held.s.Done():
		t.Fatal("the session ended, its markers readable on other connections")
	case <-time.After(within):
		t.Fatalf("the holder not told of a forced release within %v, its query's connection silent: the lock is held twice", within)
	}
}

// TestQueryRefusedAtOnce: a proxy or a rate limit that turns every marker
// query with an index away at once (429), while reads without one are
// answered, leaves the session its locks, and its marker reads paused as
// after any failure: at most two reads (the refused query and the read
// after it) a retryDelay. The read after a query that failed went without
// a pause whatever the query's time, and the two made a loop without one.
func TestQueryRefusedAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := addr(t)
	var watches, refusing atomic.Int64
	c := clientThrough(t, a, "", func(base http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if !markerRead(r) {
				return base.RoundTrip(r)
			}
			watches.Add(1)
			if refusing.Load() == 1 && r.URL.Query().Has("index") {
				return &http.Response{StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests",
					Header: http.Header{}, Body: io.NopCloser(strings.NewReader("rate limit")), Request: r}, nil
			}
			return base.RoundTrip(r)
		})
	})
	_, held, revoked := holdTwo(ctx, t, c, &watches)
	refusing.Store(1)
	// The query waiting now is answered at a write over the anchor, and
	// every query after it is refused.
	wake(t, newClient(t, a), held.s, &watches)
	// Counted over a TTL, past the loss deadline of the first refusal, so
	// that a session given up at it, its deadline not cleared by the
	// answered reads, is seen.
	start, from := time.Now(), watches.Load()
	select {
	case <-held.s.Done():
	case <-time.After(held.s.ttl):
	}
	reads, took := watches.Load()-from, time.Since(start)
	if most := 2 * (int64(took/retryDelay) + 2); reads > most {
		t.Errorf("%d marker reads in %v with every query refused at once; want at most %d, two a %v", reads, took.Round(time.Millisecond), most, retryDelay)
	}
	select {
	case <-held.s.Done():
		t.Fatal("the session was given up, its marker reads without an index answered")
	case <-revoked:
		t.Fatal("the holder was told of a forced release that nobody made")
	default:
	}
}

// TestHolderWait: the marker query of a session that holds locks is bounded
// by the renewal period, by revocationWait's bound for a long TTL, and by a
// waiter's for a TTL too short to leave room for Consul's jitter and the
// grace within a renewal period, and is the longest so bound; its wait is
// positive. A TTL under 0.75 s (which Consul takes only with its
// session_ttl_min lowered) made the wait negative.
func TestHolderWait(t *testing.T) {
	for _, ttl := range []time.Duration{600 * time.Millisecond, 3 * time.Second, MinTTL, 30 * time.Second, time.Hour, MaxTTL} {
		w := holderWait(ttl)
		want := min(queryBound(revocationWait), max(ttl/3, queryBound(waitTime)))
		if w <= 0 || queryBound(w) > want {
			t.Errorf("holderWait(%v) = %v, bound %v; want a positive wait bound by %v", ttl, w, queryBound(w), want)
		}
		// The longest such wait: a shorter one costs queries, one per wait.
		if queryBound(w) < want-time.Millisecond {
			t.Errorf("holderWait(%v) = %v, bound %v; want the longest wait bound by %v", ttl, w, queryBound(w), want)
		}
	}
}

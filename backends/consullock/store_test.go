package consullock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

const storePrefix = testPrefix + "store/"

// storeOn returns a Store on c, closed when the test ends.
func storeOn(t testing.TB, c *api.Client, opts ...StoreOption) *Store {
	t.Helper()
	s, err := NewStore(c, append([]StoreOption{WithStorePrefix(storePrefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestStoreConformance runs the store suite with its default 400 ms lease
// and retention: leases are counted by the Store that claims, retention on
// the hosts' clocks, neither in Consul's whole-second session TTLs.
func TestStoreConformance(t *testing.T) {
	a := addr(t)
	storetest.Run(t, func(t testing.TB) idempotency.Store { return storeOn(t, newClient(t, a)) })
}

// TestIdempotencyMiddleware runs httpmw's behaviour tests, over real HTTP,
// on the Consul store.
func TestIdempotencyMiddleware(t *testing.T) {
	a := addr(t)
	httpmwtest.Run(t, func(t testing.TB) idempotency.Store { return storeOn(t, newClient(t, a)) })
}

func TestStoreOptions(t *testing.T) {
	if _, err := NewStore(nil); !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), "nil consul client") {
		t.Errorf("nil client: %v, want ErrInvalidOption naming the client", err)
	}
	c := newClient(t, "127.0.0.1:1")
	for _, tc := range []struct {
		o    StoreOption
		want string
	}{
		{WithStorePrefix("/"), "prefix"},
		// Elements an HTTP path does not keep: the chunks of a long
		// response, and Purge's listing, would be elsewhere than the
		// records (and Purge slices keys shorter than the prefix).
		{WithStorePrefix("/app"), `element ""`},
		{WithStorePrefix("app//x"), `element ""`},
		{WithStorePrefix("app//"), `element ""`},
		{WithStorePrefix("app/./x"), `element "."`},
		{WithStorePrefix("./app"), `element "."`},
		{WithStorePrefix("app/.."), `element ".."`},
		{WithStorePrefix("app/../x"), `element ".."`},
		{WithStorePrefix("warden"), "overlaps"},
		{WithStorePrefix(RevokedPrefix + "x"), "overlaps"},
		{WithStoreRequestTimeout(0), "request timeout"},
		{WithStoreRequestTimeout(-time.Second), "request timeout"},
		{WithStoreSessionTTL(MinTTL - time.Millisecond), "session TTL"},
		{WithStoreSessionTTL(MaxTTL + time.Second), "session TTL"},
		{nil, "nil option"},
	} {
		if _, err := NewStore(c, tc.o); !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bad option: %v, want ErrInvalidOption naming %q", err, tc.want)
		}
	}
	s, err := NewStore(c, WithStorePrefix("app/"), WithStoreSessionTTL(MaxTTL), WithStoreRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if k := s.recordKey("a/b", "\x00c"); !strings.HasPrefix(k, "app/") || strings.ContainsAny(k[len("app/"):], "/.\x00") {
		t.Errorf("record key %q", k)
	}
	if _, ok := nameOf(s.recordKey("x", "y.lock")); ok {
		t.Error("a record key reads as a lock's key")
	}
}

// TestStoreMalformedRecord: a value the store did not write is an error,
// never a free key.
func TestStoreMalformedRecord(t *testing.T) {
	c := newClient(t, addr(t))
	s := storeOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k := fmt.Sprint("malformed-", time.Now().UnixNano())
	if _, err := c.KV().Put(&api.KVPair{Key: s.recordKey("", k), Value: []byte("not a record")}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.KV().Delete(s.recordKey("", k), nil) })
	if _, err := s.Get(ctx, "", k); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Get: %v, want ErrUnavailable", err)
	}
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "o", Lease: time.Minute}); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Claim: (%v, %v), want ErrUnavailable", rec, err)
	}
}

// TestStoreOwnerCrash: the claims of a process cut off from Consul (as a
// crash would leave them: nothing deletes them but the session's expiry) go
// with its session, within twice the session TTL, however long their
// leases; a claimant on another Store then takes the key and completes it,
// and the cut-off owner, even with Consul in reach again, can neither
// complete nor extend its stale claim: the completed record stays.
func TestStoreOwnerCrash(t *testing.T) {
	a := addr(t)
	p := drivertest.StartProxy(t, a)
	crashed, other := storeOn(t, newClient(t, p.Addr())), storeOn(t, newClient(t, a))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := fmt.Sprint("crash-", time.Now().UnixNano())
	stale := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "stale", Lease: time.Hour}
	if rec, err := crashed.Claim(ctx, stale); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	p.Blackhole()
	cutAt := time.Now()
	fresh := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "fresh", Lease: time.Hour}
	for {
		rec, err := other.Claim(ctx, fresh)
		if err != nil {
			t.Fatalf("Claim by another store: %v", err)
		}
		if rec == nil {
			break
		}
		if rec.Owner != stale.Owner {
			t.Fatalf("record owned by %q while waiting", rec.Owner)
		}
		if time.Since(cutAt) > 2*MinTTL+10*time.Second {
			t.Fatalf("the crashed owner's claim still blocks the key %v after it was cut off", time.Since(cutAt))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("claimable again %v after the owner was cut off (session TTL %v)", time.Since(cutAt).Round(time.Millisecond), MinTTL)
	if err := other.Complete(ctx, "", k, fresh.Owner, []byte("fresh"), time.Hour); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
	p.Reset()
	if err := crashed.Complete(ctx, "", k, stale.Owner, []byte("stale"), time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("stale Complete: %v, want ErrNotOwner", err)
	}
	if err := crashed.Extend(ctx, "", k, stale.Owner, time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("stale Extend: %v, want ErrNotOwner", err)
	}
	rec, err := crashed.Get(ctx, "", k)
	if err != nil || rec.State != idempotency.StateCompleted || rec.Owner != fresh.Owner || string(rec.Response) != "fresh" {
		t.Fatalf("Get after the stale writes: (%+v, %v), want fresh's completed record", rec, err)
	}
}

// TestStoreLateComplete: a Complete sent after the claim's lease ran out is
// refused even while no one else has claimed the key, and changes nothing.
func TestStoreLateComplete(t *testing.T) {
	s := storeOn(t, newClient(t, addr(t)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := fmt.Sprint("late-", time.Now().UnixNano())
	const lease = 200 * time.Millisecond
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "o", Lease: lease}); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	// The store counts the lease from the claim's send time, before
	// Claim returned: it has run out after this.
	time.Sleep(lease)
	if err := s.Complete(ctx, "", k, "o", []byte("late"), time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Fatalf("Complete after the lease: %v, want ErrNotOwner", err)
	}
	if rec, err := s.Get(ctx, "", k); err == nil && rec.State != idempotency.StateInProgress {
		t.Fatalf("record after a refused Complete: %+v", rec)
	}
}

// countingClient returns a client on a whose requests to the records under
// storePrefix are counted; the session's own requests (creation, renewal,
// its watch) are not.
func countingClient(t testing.TB, a string) (*api.Client, *atomic.Int64) {
	return countedClient(t, a, "", func(r *http.Request) bool {
		return r.URL.Path == "/v1/txn" || strings.HasPrefix(r.URL.Path, "/v1/kv/"+storePrefix)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestStoreRoundTrips counts the requests of an idempotency.Executor over
// the store: 2 for a first execution (claim, complete) and 1 for a replay
// through the same Store, chunks included (3 more puts to write a response
// too large to keep inline); a replay through a Store that never saw the key
// costs 2 (the failed claim, then the read) and the next one there 1. A
// Claim that finds the key in progress elsewhere, as a waiting duplicate
// polls, costs 2 the first time and 1 after. A Claim of a key whose record
// this Store deleted costs 1; of one deleted elsewhere, 2 (read, claim).
func TestStoreRoundTrips(t *testing.T) {
	a := addr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type counted struct {
		s *Store
		e *idempotency.Executor
		n *atomic.Int64
	}
	work := func(out []byte) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { return out, nil }
	}
	stores := make([]counted, 2)
	for i := range stores {
		c, n := countingClient(t, a)
		s := storeOn(t, c)
		e, err := idempotency.New(s)
		if err != nil {
			t.Fatal(err)
		}
		// The session is created by the first claim: not counted.
		if _, err := e.Do(ctx, fmt.Sprint("warm-", time.Now().UnixNano()), "fp", work(nil)); err != nil {
			t.Fatal(err)
		}
		stores[i] = counted{s, e, n}
	}
	one, other := stores[0], stores[1]
	cost := func(on counted, f func()) int64 {
		before := on.n.Load()
		f()
		return on.n.Load() - before
	}
	for _, tc := range []struct {
		name  string
		out   []byte
		first int64
	}{
		{"small response", []byte("201 Created"), 2},
		{"1 MiB response", bytes.Repeat([]byte{7}, idempotency.MaxResultLen), 2 + 3},
	} {
		k := fmt.Sprint("trips-", time.Now().UnixNano())
		first := cost(one, func() {
			if res, err := one.e.Do(ctx, k, "fp", work(tc.out)); err != nil || res.Replayed {
				t.Fatalf("%s: first Do: (%v, %v)", tc.name, res.Replayed, err)
			}
		})
		replay := func(on counted) int64 {
			return cost(on, func() {
				res, err := on.e.Do(ctx, k, "fp", work(nil))
				if err != nil || !res.Replayed || !bytes.Equal(res.Response, tc.out) {
					t.Fatalf("%s: replay: (%v, %d bytes, %v)", tc.name, res.Replayed, len(res.Response), err)
				}
			})
		}
		same, elsewhere, again := replay(one), replay(other), replay(other)
		t.Logf("%s: %d requests for the first execution, %d for a replay; through another store %d, then %d",
			tc.name, first, same, elsewhere, again)
		if first != tc.first || same != 1 {
			t.Errorf("%s: %d requests first, %d per replay; want %d and 1", tc.name, first, same, tc.first)
		}
		if elsewhere != 2 || again != 1 {
			t.Errorf("%s: replays through another store cost %d, then %d; want 2, then 1", tc.name, elsewhere, again)
		}
	}

	k := fmt.Sprint("polled-", time.Now().UnixNano())
	if rec, err := one.s.Claim(ctx, idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "running", Lease: time.Minute}); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	var polls []int64
	for range 3 {
		polls = append(polls, cost(other, func() {
			rec, err := other.s.Claim(ctx, idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "waiting", Lease: time.Minute})
			if err != nil || rec == nil || rec.State != idempotency.StateInProgress || rec.Owner != "running" {
				t.Fatalf("Claim of a key in progress: (%+v, %v)", rec, err)
			}
		}))
	}
	if !slices.Equal(polls, []int64{2, 1, 1}) {
		t.Errorf("polls of a key in progress cost %v requests, want [2 1 1]", polls)
	}

	// A key whose record this Store deleted is claimed first again; one
	// deleted elsewhere is read first, found gone, then claimed.
	claimCost := func(on counted, k string) int64 {
		return cost(on, func() {
			if rec, err := on.s.Claim(ctx, idempotency.Claim{Key: k, Fingerprint: "fp", Owner: "o-" + k, Lease: time.Minute}); rec != nil || err != nil {
				t.Fatalf("Claim of a deleted key: (%+v, %v)", rec, err)
			}
		})
	}
	if err := one.s.Abandon(ctx, "", k, "running"); err != nil {
		t.Fatal(err)
	}
	if n := claimCost(one, k); n != 1 {
		t.Errorf("a claim after this store's Abandon costs %d requests, want 1", n)
	}
	if err := other.s.Delete(ctx, "", k, ""); err != nil {
		t.Fatal(err)
	}
	if n := claimCost(one, k); n != 2 {
		t.Errorf("a claim of a key deleted by another store costs %d requests, want 2", n)
	}
}

// TestStorePurge: Purge deletes completed records past their retention and
// the chunks no record names, and nothing else.
func TestStorePurge(t *testing.T) {
	c := newClient(t, addr(t))
	prefix := fmt.Sprintf("%spurge-%d/", storePrefix, time.Now().UnixNano())
	s := storeOn(t, c, WithStorePrefix(prefix))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	claim := func(k string) {
		t.Helper()
		if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "o-" + k, Lease: time.Minute}); rec != nil || err != nil {
			t.Fatalf("Claim(%q): (%v, %v)", k, rec, err)
		}
	}
	claim("expired")
	if err := s.Complete(ctx, "", "expired", "o-expired", bytes.Repeat([]byte{1}, inlineResponse+1), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	claim("kept")
	if err := s.Complete(ctx, "", "kept", "o-kept", []byte("kept"), time.Hour); err != nil {
		t.Fatal(err)
	}
	claim("claimed")
	orphan := s.dir + "orphan/1/0000"
	foreign := s.dir + "other/tool/key" // not the Store's: kept
	for _, k := range []string{orphan, foreign} {
		if _, err := c.KV().Put(&api.KVPair{Key: k, Value: []byte("x")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for {
		_, err := s.Get(ctx, "", "expired")
		if errors.Is(err, idempotency.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatalf("waiting for the retention to run out: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	purged, err := s.Purge(ctx)
	if err != nil || purged != 1 {
		t.Fatalf("Purge: (%d, %v), want 1 record purged", purged, err)
	}
	keys, _, err := c.KV().Keys(prefix, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{s.recordKey("", "claimed"), s.recordKey("", "kept"), foreign}
	slices.Sort(keys)
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("keys after Purge: %q, want the claimed and the kept records and the foreign key", keys)
	}
	var nilCtx context.Context
	if _, err := s.Purge(nilCtx); !errors.Is(err, idempotency.ErrInvalid) {
		t.Errorf("Purge(nil): %v, want ErrInvalid", err)
	}
}

// TestStoreClose: Close destroys the session, which deletes the claims it
// held at once, and later calls fail.
func TestStoreClose(t *testing.T) {
	a := addr(t)
	s, err := NewStore(newClient(t, a), WithStorePrefix(storePrefix))
	if err != nil {
		t.Fatal(err)
	}
	other := storeOn(t, newClient(t, a))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := fmt.Sprint("close-", time.Now().UnixNano())
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "o", Lease: time.Hour}); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if rec, err := other.Claim(ctx, idempotency.Claim{Key: k, Owner: "p", Lease: time.Hour}); rec != nil || err != nil {
		t.Errorf("Claim after the owner's store closed: (%v, %v), want the key free", rec, err)
	}
	if _, err := s.Claim(ctx, idempotency.Claim{Key: k + "x", Owner: "o", Lease: time.Hour}); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Claim on a closed store: %v, want ErrUnavailable", err)
	}
}

// TestStoreClaimUnanswered: a claim whose request is applied but whose
// answer is lost fails for its caller, and the Store deletes it as soon as
// Consul answers again, so that the key does not stay blocked by a claim
// no one knows it holds.
func TestStoreClaimUnanswered(t *testing.T) {
	a := addr(t)
	p := drivertest.StartProxy(t, a)
	s := storeOn(t, newClient(t, p.Addr()), WithStoreRequestTimeout(500*time.Millisecond))
	other := storeOn(t, newClient(t, a))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The session first, so that only the claim's answer is lost.
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: fmt.Sprint("warm-", time.Now().UnixNano()), Owner: "w", Lease: time.Minute}); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	k := fmt.Sprint("unanswered-", time.Now().UnixNano())
	p.LoseReplies()
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "lost", Lease: time.Hour}); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Fatalf("Claim with its answer lost: (%v, %v), want ErrUnavailable", rec, err)
	}
	rec, err := other.Get(ctx, "", k)
	if err != nil || rec.Owner != "lost" {
		t.Fatalf("Get after the lost answer: (%+v, %v), want the claim applied", rec, err)
	}
	p.Reset()
	for {
		rec, err := other.Claim(ctx, idempotency.Claim{Key: k, Owner: "next", Lease: time.Hour})
		if err != nil {
			t.Fatalf("Claim by another store: %v", err)
		}
		if rec == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Complete(ctx, "", k, "lost", []byte("x"), time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete of the unanswered claim: %v, want ErrNotOwner", err)
	}
}

// TestStoreRecordFormat: records as the store wrote them before its codec
// moved to backends/internal/idemrecord decode to what they held, and are
// encoded byte for byte the same, so that stores of both versions share
// records.
func TestStoreRecordFormat(t *testing.T) {
	for _, tc := range []struct {
		v  string
		st stored
	}{
		{"\x01\x01\x02fp\aowner-1", stored{state: idempotency.StateInProgress, fingerprint: "fp", owner: "owner-1"}},
		{"\x01\x02\tsha256:ab\x01o\x95\x9a\xbd\x99\xd6\xdf\xc7\xf4\x18\x00\x00201 Created\x00\xff",
			stored{state: idempotency.StateCompleted, fingerprint: "sha256:ab", owner: "o", expires: 1795000000123456789, response: []byte("201 Created\x00\xff")}},
		{"\x01\x02\x00\x02o2\x80\x80\xce\xde\xd5\xdf\xc7\xf4\x18\x03\x86\xa4<",
			stored{state: idempotency.StateCompleted, owner: "o2", expires: 1795000000000000000, chunks: 3, chunkIndex: 987654}},
	} {
		st, err := decodeRecord([]byte(tc.v))
		if err != nil || !reflect.DeepEqual(st, tc.st) {
			t.Errorf("decode %q: (%+v, %v), want %+v", tc.v, st, err, tc.st)
		}
		if v := encodeRecord(tc.st); string(v) != tc.v {
			t.Errorf("encode %+v: %q, want %q", tc.st, v, tc.v)
		}
	}
	s := &Store{dir: "app/"}
	if k := s.recordKey("scope/x", "key\x00y"); k != "app/B3Njb3BlL3hrZXkAeQ" {
		t.Errorf("record key %q, want the one the store used before", k)
	}
	// A deadline beyond int64 was never written: a malformed record.
	if _, err := decodeRecord([]byte("\x01\x02\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x00")); !errors.Is(err, errMalformed) {
		t.Errorf("deadline past int64: %v, want errMalformed", err)
	}
}

// TestStoreCutOffWorkStopsFirst: an Executor's work on a Store cut off from
// Consul is told to stop when the Store's session is lost, before Consul
// deletes the claim with the session and another process claims the key
// and starts the same work, although the claim's 90 s lease is renewed
// only every 30 s and would be renewed (and fail) only after that.
func TestStoreCutOffWorkStopsFirst(t *testing.T) {
	a := addr(t)
	p := drivertest.StartProxy(t, a)
	cut, err := idempotency.New(storeOn(t, newClient(t, p.Addr())), idempotency.WithLease(90*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other, err := idempotency.New(storeOn(t, newClient(t, a)), idempotency.WithLease(90*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprint("cut-", time.Now().UnixNano())
	running, told := make(chan struct{}), make(chan time.Time, 1)
	go cut.Do(context.Background(), k, "fp", func(ctx context.Context) ([]byte, error) {
		close(running)
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), idempotency.ErrNotOwner) {
			t.Errorf("the cut-off work was told %v, want ErrNotOwner", context.Cause(ctx))
		}
		told <- time.Now()
		return nil, context.Cause(ctx)
	})
	<-running
	p.Blackhole()
	cutAt := time.Now()
	var started time.Time
	for started.IsZero() {
		if time.Since(cutAt) > 2*MinTTL+10*time.Second {
			t.Fatalf("the cut-off claim still blocks the key %v after the cut", time.Since(cutAt))
		}
		_, err := other.Do(context.Background(), k, "fp", func(context.Context) ([]byte, error) {
			started = time.Now()
			return []byte("other"), nil
		})
		if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("the other process: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case at := <-told:
		t.Logf("cut-off work told %v after the cut; the other's started %v after it", at.Sub(cutAt).Round(time.Millisecond), started.Sub(cutAt).Round(time.Millisecond))
		if !at.Before(started) {
			t.Errorf("the other process started the work %v before the cut-off one was told to stop", at.Sub(started))
		}
	default:
		t.Errorf("the other process started the work %v after the cut while the cut-off one still ran, not told", started.Sub(cutAt))
	}
}

// TestStoreErrorsHideRecordPaths: a request that fails gives the record's
// path in its error (the URL of a chunk's put, of a read), whose base64 is
// the scope and the key; the store's errors carry neither, so that what
// the Executor logs and returns names the key only as its hash.
func TestStoreErrorsHideRecordPaths(t *testing.T) {
	a := addr(t)
	p := drivertest.StartProxy(t, a)
	st := storeOn(t, newClient(t, p.Addr()))
	ctx := context.Background()
	scope, key := "tenant-7", fmt.Sprint("order-", time.Now().UnixNano())
	c := idempotency.Claim{Scope: scope, Key: key, Fingerprint: "fp", Owner: "o", Lease: time.Minute}
	if rec, err := st.Claim(ctx, c); rec != nil || err != nil {
		t.Fatalf("Claim: (%v, %v)", rec, err)
	}
	p.Cut()
	enc := strings.TrimPrefix(st.recordKey(scope, key), st.dir)
	check := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, idempotency.ErrUnavailable) {
			t.Fatalf("%s with Consul out of reach: %v, want ErrUnavailable", op, err)
		}
		if msg := err.Error(); strings.Contains(msg, enc) || strings.Contains(msg, key) {
			t.Errorf("%s's error names the record: %s", op, msg)
		}
	}
	// A response past inlineResponse goes in chunks, each put under the
	// record's path.
	check("Complete", st.Complete(ctx, scope, key, "o", make([]byte, inlineResponse+1), time.Hour))
	_, _, err := st.read(ctx, st.recordKey(scope, key))
	check("read", err)
}

// A failed check names its key, which may hold the words Consul starts an
// ACL refusal with: a Store under such a prefix answered the second Claim
// of a taken record as refused for want of rights, not with the record.
func TestStorePrefixWithRefusalWords(t *testing.T) {
	c := newClient(t, addr(t))
	prefix := fmt.Sprintf("warden-test/Permission denied %d/", time.Now().UnixNano())
	defer c.KV().DeleteTree(prefix, nil)
	a := storeOn(t, c, WithStorePrefix(prefix))
	b := storeOn(t, newClient(t, addr(t)), WithStorePrefix(prefix))
	ctx := context.Background()
	cl := idempotency.Claim{Scope: "s", Key: "k", Fingerprint: "fp", Owner: "a", Lease: time.Minute}
	if rec, err := a.Claim(ctx, cl); rec != nil || err != nil {
		t.Fatalf("first Claim: %v, %v", rec, err)
	}
	cl.Owner = "b"
	if rec, err := b.Claim(ctx, cl); err != nil || rec == nil {
		t.Errorf("second Claim of a taken record: %v, %v; want the record", rec, err)
	}
}

package etcdlock

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

// newStore returns a store on a client of its own, as a separate
// process would have.
func newStore(t testing.TB, eps []string) *Store {
	t.Helper()
	s, err := NewStore(newClient(t, eps), WithStorePrefix(testPrefix+"store"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreConformance runs the store suite with MinTTL as the
// short lease: a shorter one would be rounded up to it by the server anyway,
// and the suite's patience grows with the lease it is told.
func TestStoreConformance(t *testing.T) {
	eps := endpoints(t)
	storetest.Run(t, func(t testing.TB) idempotency.Store { return newStore(t, eps) },
		storetest.Lease(MinTTL))
}

// TestIdempotencyMiddleware runs httpmw's behaviour tests, over real HTTP, on
// the etcd store; its 500 ms lease becomes etcd's minimum TTL.
func TestIdempotencyMiddleware(t *testing.T) {
	eps := endpoints(t)
	httpmwtest.Run(t, func(t testing.TB) idempotency.Store { return newStore(t, eps) })
}

func TestStoreOptions(t *testing.T) {
	if _, err := NewStore(nil); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("nil client: %v, want ErrInvalidOption", err)
	}
	c := newClient(t, endpoints(t))
	for _, o := range []StoreOption{WithStorePrefix("/"), WithStoreRequestTimeout(0), nil} {
		if _, err := NewStore(c, o); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("bad option: %v, want ErrInvalidOption", err)
		}
	}
	s, err := NewStore(c, WithStorePrefix("app/"))
	if err != nil {
		t.Fatal(err)
	}
	if k := s.recordKey("a/b", "\x00c"); !strings.HasPrefix(k, "app/idem/") || strings.ContainsAny(k[len("app/idem/"):], "/\x00") {
		t.Errorf("record key %q", k)
	}
}

func TestIdempotencyTTLSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		time.Nanosecond:               1,
		500 * time.Millisecond:        1,
		time.Second:                   1,
		time.Second + time.Nanosecond: 2,
		2 * time.Second:               2,
		time.Duration(1<<63 - 1):      maxLeaseTTL,
	} {
		if got := ttlSeconds(d); got != want {
			t.Errorf("ttlSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestIdempotencyMalformedRecord: a value the store did not write is an
// error, never a free key.
func TestIdempotencyMalformedRecord(t *testing.T) {
	eps := endpoints(t)
	s := newStore(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k := "malformed-" + time.Now().Format(time.RFC3339Nano)
	if _, err := s.client.Put(ctx, s.recordKey("", k), "not a record"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.client.Delete(context.Background(), s.recordKey("", k)) })
	if _, err := s.Get(ctx, "", k); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Get: %v, want ErrUnavailable", err)
	}
	if rec, err := s.Claim(ctx, idempotency.Claim{Key: k, Owner: "o", Lease: MinTTL}); !errors.Is(err, idempotency.ErrUnavailable) {
		t.Errorf("Claim: (%v, %v), want ErrUnavailable", rec, err)
	}
}

// TestStoreRoundTrips counts what the store sends etcd (unary requests and
// stream messages alike): a first request is a claim and a completion, one
// transaction each, once the shared leases of their durations are granted;
// a replay is one transaction; the owner's Complete of a claim another
// Store made, or after another Store's Extend, reads the record first or
// retries once. None of it revokes or keeps alive a lease.
func TestStoreRoundTrips(t *testing.T) {
	eps := endpoints(t)
	var rc requestCounter
	s, err := NewStore(newClient(t, eps, rc.dialOptions()...), WithStorePrefix(testPrefix+"store"))
	if err != nil {
		t.Fatal(err)
	}
	other := newStore(t, eps)
	ctx := context.Background()
	const lease, retention = 10 * time.Second, time.Minute
	sent := func(what string, want int64, f func() error) {
		t.Helper()
		before := rc.sent.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := rc.sent.Load() - before; n != want {
			t.Errorf("%s: %d requests, want %d", what, n, want)
		}
	}
	claim := func(key string) idempotency.Claim {
		return idempotency.Claim{Key: key, Fingerprint: "fp", Owner: "owner-" + key, Lease: lease}
	}
	// The first claim and completion grant the shared leases.
	warm := claim(name("warm"))
	sent("claim with a grant", 2, func() error { _, err := s.Claim(ctx, warm); return err })
	sent("complete with a grant", 2, func() error { return s.Complete(ctx, "", warm.Key, warm.Owner, []byte("r"), retention) })

	c := claim(name("first"))
	sent("claim", 1, func() error {
		rec, err := s.Claim(ctx, c)
		if rec != nil {
			t.Errorf("claim of a new key found %+v", rec)
		}
		return err
	})
	sent("complete", 1, func() error { return s.Complete(ctx, "", c.Key, c.Owner, []byte("done"), retention) })
	sent("replay", 1, func() error {
		rec, err := s.Claim(ctx, idempotency.Claim{Key: c.Key, Fingerprint: "fp", Owner: "late", Lease: lease})
		if rec == nil || rec.State != idempotency.StateCompleted || string(rec.Response) != "done" {
			t.Errorf("replay found %+v", rec)
		}
		return err
	})

	// Another Store's claim: its owner's Complete here reads it first.
	c = claim(name("elsewhere"))
	if _, err := other.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	sent("complete of another store's claim", 2, func() error { return s.Complete(ctx, "", c.Key, c.Owner, []byte("x"), retention) })

	// Extended by another Store meanwhile: the fenced transaction fails,
	// reads the new version in the same request, and is tried again.
	c = claim(name("extended"))
	if _, err := s.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := other.Extend(ctx, "", c.Key, c.Owner, lease); err != nil {
		t.Fatal(err)
	}
	sent("complete after another store's extend", 2, func() error { return s.Complete(ctx, "", c.Key, c.Owner, []byte("y"), retention) })
	rec, err := other.Get(ctx, "", c.Key)
	if err != nil || rec.State != idempotency.StateCompleted || string(rec.Response) != "y" {
		t.Fatalf("after Complete: %+v, %v", rec, err)
	}

	// A stale owner's Complete changes nothing.
	if err := s.Complete(ctx, "", c.Key, c.Owner, []byte("again"), retention); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Fatalf("second Complete: %v, want ErrNotOwner", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.claims) != 0 {
		t.Errorf("%d claims remembered after every claim ended", len(s.claims))
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
		{"\x01\x01\x03\x02fp\aowner-1", stored{state: idempotency.StateInProgress, ttl: 3, fingerprint: "fp", owner: "owner-1"}},
		{"\x01\x02\x81\xa3\x05\tsha256:ab\x01o201 Created\x00\xff",
			stored{state: idempotency.StateCompleted, ttl: 86401, fingerprint: "sha256:ab", owner: "o", response: []byte("201 Created\x00\xff")}},
		{"\x01\x02\x80\xb4\xc4\xc3!\x00\x02o2", stored{state: idempotency.StateCompleted, ttl: maxLeaseTTL, owner: "o2"}},
	} {
		st, err := decodeRecord([]byte(tc.v))
		if err != nil || !reflect.DeepEqual(st, tc.st) {
			t.Errorf("decode %q: (%+v, %v), want %+v", tc.v, st, err, tc.st)
		}
		if v := encodeRecord(tc.st); v != tc.v {
			t.Errorf("encode %+v: %q, want %q", tc.st, v, tc.v)
		}
	}
	s := &Store{dir: "app/idem/"}
	if k := s.recordKey("scope/x", "key\x00y"); k != "app/idem/B3Njb3BlL3hrZXkAeQ" {
		t.Errorf("record key %q, want the one the store used before", k)
	}
	for _, v := range []string{"", "\x02\x01\x03\x02fp\x00", "\x01\x03\x03\x02fp\x00", "\x01\x01\x03\x05fp\x00"} {
		if _, err := decodeRecord([]byte(v)); !errors.Is(err, errMalformed) {
			t.Errorf("decode %q: %v, want errMalformed", v, err)
		}
	}
}

// TestStoreLeaseRevoked: a shared lease an operator revoked takes its
// records with it, but the records written next, within the half second
// the store would have attached them to it, go on a new lease: a Claim
// and a Complete succeed, and their records live.
func TestStoreLeaseRevoked(t *testing.T) {
	eps := endpoints(t)
	s := newStore(t, eps)
	admin := newClient(t, eps)
	ctx := context.Background()
	key := name("lease-revoked")
	revoke := func(ttl time.Duration) {
		t.Helper()
		s.mu.Lock()
		sl := s.leases[ttlSeconds(ttl)]
		s.mu.Unlock()
		if sl == nil {
			t.Fatalf("no shared lease of %v", ttl)
		}
		<-sl.ready
		if _, err := admin.Revoke(ctx, sl.id); err != nil {
			t.Fatal(err)
		}
		// The next record must find the revoked lease still fresh, however
		// long the machine took since the grant: past leaseReuse, a new
		// lease is granted anyway.
		s.mu.Lock()
		sl.sent = time.Now()
		s.mu.Unlock()
	}
	claim := func(k string) idempotency.Claim {
		return idempotency.Claim{Key: k, Fingerprint: "f", Owner: "owner of " + k, Lease: time.Minute}
	}
	for _, k := range []string{key + "/1", key + "/2"} {
		if _, err := s.Claim(ctx, claim(k)); err != nil {
			t.Fatal(err)
		}
		revoke(time.Minute)
	}
	if err := s.Complete(ctx, "", key+"/2", "owner of "+key+"/2", []byte("done"), time.Hour); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Complete of a claim whose lease was revoked: %v, want ErrNotOwner", err)
	}
	if _, err := s.Claim(ctx, claim(key+"/3")); err != nil {
		t.Fatalf("Claim just after its shared lease was revoked: %v", err)
	}
	if err := s.Complete(ctx, "", key+"/3", "owner of "+key+"/3", []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	revoke(time.Hour)
	if _, err := s.Claim(ctx, claim(key+"/4")); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "", key+"/4", "owner of "+key+"/4", []byte("done"), time.Hour); err != nil {
		t.Fatalf("Complete just after its shared lease was revoked: %v", err)
	}
	if rec, err := s.Get(ctx, "", key+"/4"); err != nil || rec.State != idempotency.StateCompleted {
		t.Errorf("the completed record: %+v, %v", rec, err)
	}
}

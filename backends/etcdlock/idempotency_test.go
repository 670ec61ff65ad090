package etcdlock

import (
	"context"
	"errors"
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

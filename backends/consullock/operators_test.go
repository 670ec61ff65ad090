package consullock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

// eventually waits, up to within, for cond to hold, and fails the test
// saying what did not happen when it does not.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
	}
}

// TestWrittenOverKeyReleased: a key written over while held (consul kv put
// keeps the key's session, and changes its ModifyIndex) is released by
// its holder's Release. Its release, checked on the old ModifyIndex,
// failed: Release reported ErrNotHeld, and the session kept the key, and
// the lock, for as long as it lived.
func TestWrittenOverKeyReleased(t *testing.T) {
	c := newClient(t, addr(t))
	l := lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := driver.AcquireOptions{TTL: MinTTL, Owner: "holder"}
	for what, acquire := range acquirers(l) {
		k := name("written-over")
		le, err := acquire(ctx, k, opts)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		held := le.(*lease)
		if _, err := c.KV().Put(&api.KVPair{Key: held.key, Value: []byte("an operator's")}, nil); err != nil {
			t.Fatal(err)
		}
		if kv, _, err := c.KV().Get(held.key, nil); err != nil || kv == nil || kv.Session != held.s.id || kv.ModifyIndex == held.token {
			t.Fatalf("%s: the key after the put: %+v, %v; want it still acquired by the holder's session, with a new ModifyIndex", what, kv, err)
		}
		if err := le.Refresh(ctx, MinTTL); err != nil {
			t.Errorf("%s: Refresh of the key written over: %v", what, err)
		}
		if err := le.Release(ctx); err != nil {
			t.Errorf("%s: Release of the key written over: %v", what, err)
		}
		if kv, _, err := c.KV().Get(held.key, nil); err != nil || kv != nil {
			t.Errorf("%s: the key after the release: %+v, %v; want it gone", what, kv, err)
		}
	}
}

// acquirers returns l's ways of acquiring a name, by the name of each: a
// lock, a read/write lock's reader and writer, a semaphore's permit (of
// one).
func acquirers(l *Locker) map[string]func(context.Context, string, driver.AcquireOptions) (driver.Lease, error) {
	return map[string]func(context.Context, string, driver.AcquireOptions) (driver.Lease, error){
		"Acquire": l.Acquire, "AcquireRead": l.AcquireRead, "AcquireWrite": l.AcquireWrite,
		"AcquireSemaphore": func(ctx context.Context, k string, opts driver.AcquireOptions) (driver.Lease, error) {
			return l.AcquireSemaphore(ctx, k, 1, opts)
		},
	}
}

// TestNamespaceRefusedAtOnce: a client configured with a namespace, which
// Consul without Enterprise refuses for every request (400), fails a
// waiting acquisition at once with Consul's reason: it was taken for an
// outage and sent again until its context ended.
func TestNamespaceRefusedAtOnce(t *testing.T) {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Namespace = addr(t), "team-a"
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cfg.Transport.CloseIdleConnections)
	l := lockerOn(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, opts := range []driver.AcquireOptions{{TTL: MinTTL}, {TTL: MinTTL, Wait: true}, {TTL: MinTTL, Wait: true, Fair: true}} {
		le, err := l.Acquire(ctx, name("namespace"), opts)
		if le != nil || !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "Namespaces are a Consul Enterprise feature") {
			t.Errorf("Acquire(%+v): %v; want the refusal, at once", opts, err)
		}
	}
	if _, err := l.Inspect(ctx, name("namespace")); !errors.Is(err, errRefused) {
		t.Errorf("Inspect: %v; want the refusal", err)
	}
}

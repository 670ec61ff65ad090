package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestOnConsul is TestOnEveryBackend on Consul, whose sessions take TTLs of
// 10 s at least: a held lock is listed and shown, and released on a "yes",
// which cancels the holder's context at once (its session lives on: the
// revocation tells it); an idempotency record claimed on the Consul store
// is shown, without its owner's token, and deleted.
func TestOnConsul(t *testing.T) {
	url := "consul://" + drivertest.Addr(t, "WARDEN_CONSUL_ADDR", "127.0.0.1:18500")
	ctx := context.Background()
	u, err := backendurl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	o := backendurl.NewOpener()
	t.Cleanup(o.Close)
	const ttl = 10 * time.Second
	locker, err := o.Locker(ctx, u, ttl)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(locker, guard.WithOwner("orders-svc/7"), guard.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("cli/consul/%d", time.Now().UnixNano())
	held, err := g.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)

	code, out, errOut := cliRun(t, "", "-lock", url, "locks", "ls", "cli/consul/")
	if code != 0 || !strings.Contains(out, key) || !strings.Contains(out, "orders-svc/7") {
		t.Fatalf("locks ls: %d %q %q; want the held key and its owner", code, out, errOut)
	}
	code, out, errOut = cliRun(t, "", "-lock", url, "-json", "locks", "show", key)
	var in guard.Inspection
	if code != 0 || json.Unmarshal([]byte(out), &in) != nil || len(in.Holders) != 1 || in.Holders[0].Token != held.Token() {
		t.Fatalf("locks show -json: %d %q %q; want one holder with token %d", code, out, errOut, held.Token())
	}
	code, out, errOut = cliRun(t, "y\n", "-lock", url, "locks", "release", key)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("released %q from %q", key, "orders-svc/7")) {
		t.Fatalf("release answered yes: %d %q %q", code, out, errOut)
	}
	start := time.Now()
	select {
	case <-held.Context().Done():
	case <-time.After(ttl):
		t.Fatal("the old holder's context was not cancelled within a TTL of the release")
	}
	t.Logf("holder cancelled %v after the release returned", time.Since(start))
	if !errors.Is(held.Err(), guard.ErrLockLost) {
		t.Fatalf("the old holder's Err: %v, want ErrLockLost", held.Err())
	}
	if code, out, errOut := cliRun(t, "", "-lock", url, "ping"); code != 0 || !strings.Contains(out, "answered") {
		t.Fatalf("ping: %d %q %q", code, out, errOut)
	}

	idemHalf(t, o, u, url, key)
}

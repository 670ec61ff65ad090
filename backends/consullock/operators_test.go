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

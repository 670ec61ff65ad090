package consullock

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// heldAndClaimed holds a new key and claims its record on c (see
// drivertest.HeldAndClaimed).
func heldAndClaimed(t *testing.T, c *api.Client) (string, func() (held, kept bool)) {
	key := name("notsent")
	return key, drivertest.HeldAndClaimed(t, lockerOn(t, c), storeOn(t, c), key)
}

// TestChangesRefusedMarkedNotSent: a forced release, a record's delete and
// its abandon that Consul never got (the agent gone, its port closed) or
// refused (a token that may only read) fail matching driver.ErrNotSent,
// and the lock and the record are kept.
func TestChangesRefusedMarkedNotSent(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, c *api.Client, key string, still func() (bool, bool)) {
		t.Helper()
		drivertest.WantNotSent(t, ctx, drivertest.OperatorChanges(lockerOn(t, c), storeOn(t, c), key))
		if held, kept := still(); !held || !kept {
			t.Errorf("after the refused changes: held %v, kept %v; want both", held, kept)
		}
	}
	t.Run("agent down", func(t *testing.T) {
		key, still := heldAndClaimed(t, newClient(t, addr(t)))
		p := drivertest.StartProxy(t, addr(t))
		p.Down()
		check(t, newClient(t, p.Addr()), key, still)
	})
	t.Run("read-only token", func(t *testing.T) {
		a, root := aclAgent(t)
		key, still := heldAndClaimed(t, allowed(t, a, root, everything))
		check(t, allowed(t, a, root, `key_prefix "" { policy = "read" } session_prefix "" { policy = "write" }`), key, still)
	})
}

// TestChangesUnansweredNotMarked: a change whose answer is lost after
// Consul applied it (its answer held back by the proxy, the connection
// then reset) fails without driver.ErrNotSent.
func TestChangesUnansweredNotMarked(t *testing.T) {
	ctx := context.Background()
	p := drivertest.StartProxy(t, addr(t))
	via := newClient(t, p.Addr())
	for _, change := range []string{"ForceRelease", "Delete", "DeleteOwned", "Abandon"} {
		t.Run(change, func(t *testing.T) {
			p.Reset()
			key, still := heldAndClaimed(t, newClient(t, addr(t)))
			f := drivertest.OperatorChanges(lockerOn(t, via), storeOn(t, via), key)[change]
			drivertest.WantAnswerLostUnmarked(t, p, time.Second, func() error { return f(ctx) }, func() bool {
				held, kept := still()
				return change == "ForceRelease" && !held || change != "ForceRelease" && !kept
			})
		})
	}
}

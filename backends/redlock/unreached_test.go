package redlock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestWaitReportsWhyUnreached: a waiting acquisition on nodes that nothing
// listens on ends with its context's error carrying the last attempt's
// failure (driver.Unreached), which guard tells a caller whose bound ran
// out with no answer.
func TestWaitReportsWhyUnreached(t *testing.T) {
	addrs := make([]string, 3)
	for i := range addrs {
		addrs[i] = drivertest.ClosedAddr(t)
	}
	l, err := New(clients(t, addrs, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = l.Acquire(ctx, "k", driver.AcquireOptions{TTL: 10 * time.Second, Wait: true})
	drivertest.WantUnreached(t, "Acquire on nodes nothing listens on", err)
}

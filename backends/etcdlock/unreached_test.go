package etcdlock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestWaitReportsWhyUnreached: a waiting acquisition on an endpoint that
// nothing listens on, whose requests time out before its context ends,
// ends with the context's error carrying the last attempt's failure
// (driver.Unreached), which guard tells a caller whose bound ran out with
// no answer.
func TestWaitReportsWhyUnreached(t *testing.T) {
	addr := drivertest.ClosedAddr(t)
	l, _ := newLocker(t, []string{addr}, WithRequestTimeout(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := l.Acquire(ctx, "k", driver.AcquireOptions{TTL: 10 * time.Second, Wait: true})
	drivertest.WantUnreached(t, "Acquire on an endpoint nothing listens on", err)
}

package redislock

import (
	"testing"
	"time"

	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

func TestIdempotencyStoreConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) idempotency.Store { return newStore(t, newClient(t)) },
		storetest.Lease(300*time.Millisecond))
}

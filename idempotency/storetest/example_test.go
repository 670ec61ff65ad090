package storetest_test

import (
	"testing"
	"time"

	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

// A store runs the suite from its own test, handing it a factory of clients
// of one store. This is the memory store's; a networked store opens a new
// connection to the same server in each call.
func ExampleRun() {
	testConformance := func(t *testing.T) {
		st := idempotency.NewMemoryStore()
		storetest.Run(t, func(testing.TB) idempotency.Store { return st },
			storetest.Lease(300*time.Millisecond))
	}
	_ = testConformance
}

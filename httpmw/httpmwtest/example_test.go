package httpmwtest_test

import (
	"testing"

	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
)

// A store runs the middleware's behaviour tests from its own test, handing
// it a factory of clients of one store, as for idempotency/storetest.
func ExampleRun() {
	testHTTP := func(t *testing.T) {
		st := idempotency.NewMemoryStore()
		httpmwtest.Run(t, func(testing.TB) idempotency.Store { return st })
	}
	_ = testHTTP
}

package httpmw_test

import (
	"testing"

	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
)

func TestIdempotencyMemoryStore(t *testing.T) {
	st := idempotency.NewMemoryStore()
	httpmwtest.Run(t, func(testing.TB) idempotency.Store { return st })
}

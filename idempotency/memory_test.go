package idempotency_test

import (
	"testing"

	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/idempotency/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	st := idempotency.NewMemoryStore()
	storetest.Run(t, func(testing.TB) idempotency.Store { return st })
}

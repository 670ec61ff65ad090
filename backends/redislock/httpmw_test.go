package redislock

import (
	"testing"

	"github.com/warden-go/warden/httpmw/httpmwtest"
	"github.com/warden-go/warden/idempotency"
)

// TestIdempotencyMiddleware runs httpmw's behaviour tests, over real HTTP,
// on the Redis store: the middleware's guarantees are only as good as the
// store under it.
func TestIdempotencyMiddleware(t *testing.T) {
	httpmwtest.Run(t, func(t testing.TB) idempotency.Store { return newStore(t, newClient(t)) })
}

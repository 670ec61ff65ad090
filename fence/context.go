package fence

import (
	"context"

	"github.com/warden-go/warden/guard"
)

type claimKey struct{}

// WithClaim returns a context carrying c, which FromContext finds before any
// lock: how a service that was sent a claim (httpmw.Fence) hands it to its
// own fenced writes.
func WithClaim(ctx context.Context, c Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}

// FromContext returns the claim ctx carries: the one WithClaim put there,
// or else the claim of the innermost lock it carries (guard.FromContext),
// its token on its key. ok is false when there is neither.
func FromContext(ctx context.Context) (c Claim, ok bool) {
	if ctx == nil {
		return Claim{}, false
	}
	if c, ok := ctx.Value(claimKey{}).(Claim); ok {
		return c, true
	}
	if l := guard.FromContext(ctx); l != nil {
		return Of(l), true
	}
	return Claim{}, false
}

package guard

import "context"

// FromContext returns the innermost lock ctx carries (ctx is, or derives
// from, that Lock's Context), or nil when it carries none. Code handed only
// a context, such as a storage layer that fences its writes with the lock's
// token (package fence), finds the lock here without a *Lock parameter. The
// lock may have been lost or unlocked since; its Err says so.
func FromContext(ctx context.Context) *Lock {
	if ctx == nil {
		return nil
	}
	return heldBy(ctx)
}

// FromContextKey returns the lock on key (as it was passed to Lock) among
// those ctx carries, innermost first, or nil: under DoAll, or nested locks,
// the context carries several.
func FromContextKey(ctx context.Context, key string) *Lock {
	if ctx == nil {
		return nil
	}
	for l := heldBy(ctx); l != nil; l = l.outer() {
		if l.key == key {
			return l
		}
	}
	return nil
}

package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/warden-go/warden/guard"
)

// ErrStaleToken: a fenced write was refused because the resource has
// accepted a higher token. Every engine's refusal wraps it, and
// guard.ErrLockLost too: the writer's lock was lost (it would not carry an
// older token otherwise), and what it was doing should stop.
var ErrStaleToken = errors.New("stale fencing token")

// Claim is what a fenced write carries: the resource it writes and the
// fencing token of the lock it was made under.
type Claim struct {
	// Resource names what the token orders writes to; see the package
	// documentation.
	Resource string
	// Token is the lock's fencing token; 0 is never a lock's token.
	Token uint64
}

// Of returns the claim of a held lock: its token on its key.
func Of(l *guard.Lock) Claim { return Claim{Resource: l.Key(), Token: l.Token()} }

// On returns the claim with its token on another resource.
func (c Claim) On(resource string) Claim { c.Resource = resource; return c }

// String is "resource@token".
func (c Claim) String() string { return c.Resource + "@" + strconv.FormatUint(c.Token, 10) }

// MaxResource is the longest resource name, in bytes, every engine accepts
// (the SQL fence table's column holds 255).
const MaxResource = 255

// Validate reports a claim no engine can fence: an empty or over-long
// resource, or a zero token, with an error wrapping guard.ErrInvalidOption.
// The engines call it before any round trip.
func (c Claim) Validate() error {
	switch {
	case c.Resource == "":
		return fmt.Errorf("warden: fence: %w: empty resource", guard.ErrInvalidOption)
	case len(c.Resource) > MaxResource:
		return fmt.Errorf("warden: fence: %w: resource of %d bytes, above %d", guard.ErrInvalidOption, len(c.Resource), MaxResource)
	case c.Token == 0:
		return fmt.Errorf("warden: fence: %w: token 0 on resource %q", guard.ErrInvalidOption, c.Resource)
	}
	return nil
}

// Stale returns the refusal of a write under c on a resource whose highest
// accepted token is highest (0: not known to the engine that refused). It
// wraps ErrStaleToken and guard.ErrLockLost; the engines return it.
func Stale(c Claim, highest uint64) error { return &staleError{claim: c, highest: highest} }

type staleError struct {
	claim   Claim
	highest uint64
}

func (e *staleError) Error() string {
	s := fmt.Sprintf("warden: fence: resource %q: %s %d", e.claim.Resource, ErrStaleToken, e.claim.Token)
	if e.highest != 0 {
		s += ", below the accepted " + strconv.FormatUint(e.highest, 10)
	}
	return s + "; the lock was " + guard.ErrLockLost.Error()
}

func (e *staleError) Is(target error) bool {
	return target == ErrStaleToken || target == guard.ErrLockLost || target == guard.ErrNotHeld
}

// Highest returns the highest token of a refusal made by Stale, 0 when the
// engine did not know it or err is not one.
func Highest(err error) uint64 {
	var s *staleError
	if errors.As(err, &s) {
		return s.highest
	}
	return 0
}

// Fencer keeps resources' highest tokens on an engine: what httpmw.Fence
// checks a request's claim with. Each engine's fence implements it.
type Fencer interface {
	// Advance accepts c when its token is at least c.Resource's highest,
	// making it the highest, and otherwise returns an error wrapping
	// ErrStaleToken, in one atomic operation.
	Advance(ctx context.Context, c Claim) error
}

package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
)

func TestStale(t *testing.T) {
	err := fence.Stale(fence.Claim{Resource: "account/42", Token: 3}, 7)
	for _, target := range []error{fence.ErrStaleToken, guard.ErrLockLost, guard.ErrNotHeld} {
		if !errors.Is(err, target) {
			t.Errorf("errors.Is(%v, %v) = false", err, target)
		}
	}
	if got := fence.Highest(err); got != 7 {
		t.Errorf("Highest = %d, want 7", got)
	}
	if msg := err.Error(); !strings.Contains(msg, `"account/42"`) || !strings.Contains(msg, "3") || !strings.Contains(msg, "7") {
		t.Errorf("message %q does not name the resource and both tokens", msg)
	}
	if fence.Highest(errors.New("other")) != 0 {
		t.Error("Highest of another error is not 0")
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []fence.Claim{{Resource: "", Token: 1}, {Resource: "r", Token: 0}, {Resource: strings.Repeat("r", fence.MaxResource+1), Token: 1}} {
		if err := c.Validate(); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("Validate(%v) = %v, want ErrInvalidOption", c, err)
		}
	}
	if err := (fence.Claim{Resource: "r", Token: 1}).Validate(); err != nil {
		t.Errorf("a valid claim: %v", err)
	}
}

// TestFromContext: the claim of the lock fn's context carries (the innermost
// one under nesting), unless one was put there explicitly.
func TestFromContext(t *testing.T) {
	g, err := guard.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, ok := fence.FromContext(ctx); ok {
		t.Error("a bare context carries a claim")
	}
	err = g.Do(ctx, "outer", func(ctx context.Context, outer *guard.Lock) error {
		if c, ok := fence.FromContext(ctx); !ok || c != fence.Of(outer) || c.Resource != "outer" || c.Token == 0 {
			t.Errorf("in Do: %v %v, want %v", c, ok, fence.Of(outer))
		}
		return g.Do(ctx, "inner", func(ctx context.Context, inner *guard.Lock) error {
			if c, _ := fence.FromContext(ctx); c != fence.Of(inner) {
				t.Errorf("nested: %v, want the inner lock's %v", c, fence.Of(inner))
			}
			if l := guard.FromContextKey(ctx, "outer"); l != outer {
				t.Errorf("FromContextKey(outer) = %v, want the outer lock", l)
			}
			want := fence.Claim{Resource: "elsewhere", Token: 9}
			if c, _ := fence.FromContext(fence.WithClaim(ctx, want)); c != want {
				t.Errorf("with an explicit claim: %v, want %v", c, want)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

package drivertest

import (
	"testing"

	"github.com/warden-go/warden/guard/driver"
)

// testInspect checks a backend's Inspector, when it has one, from another
// client than the holder's, as an operator or an observer would look.
func testInspect(t *testing.T, b *Backend) {
	holder, observer := b.NewLocker(t), b.NewLocker(t)
	in, ok := observer.(driver.Inspector)
	if !ok {
		t.Skip("the backend does not implement driver.Inspector")
	}
	ctx := b.ctx(t)
	k := key(t)
	look := func() driver.Inspection {
		t.Helper()
		got, err := in.Inspect(ctx, k)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", k, err)
		}
		return got
	}
	if got := look(); len(got.Holders) != 0 {
		t.Fatalf("a key never taken: %+v, want no holders", got)
	}
	o := b.opts(false)
	o.Owner = "replica-7 (conformance)"
	lease := mustAcquire(t, holder, ctx, k, o)
	got := look()
	if len(got.Holders) != 1 {
		t.Fatalf("a held key: %+v, want one holder", got)
	}
	h := got.Holders[0]
	if h.Owner != o.Owner || h.Token != lease.Token() {
		t.Fatalf("holder %+v, want owner %q and token %d", h, o.Owner, lease.Token())
	}
	if h.SessionBound {
		if h.TTL != 0 {
			t.Fatalf("a session-bound holder with TTL %v, want 0", h.TTL)
		}
	} else if h.TTL <= 0 || h.TTL > o.TTL {
		t.Fatalf("holder's TTL %v, want within (0, %v]", h.TTL, o.TTL)
	}
	release(t, lease)
	b.eventually(t, "the released key shows no holder", func() bool { return len(look().Holders) == 0 })

	// A holder without a label is reported without one.
	lease = mustAcquire(t, holder, ctx, k, b.opts(false))
	if got := look(); len(got.Holders) != 1 || got.Holders[0].Owner != "" || got.Holders[0].Token != lease.Token() {
		t.Fatalf("an unlabelled holder: %+v, want token %d and no owner", got, lease.Token())
	}
	release(t, lease)
}

package drivertest

import (
	"errors"
	"testing"
	"time"

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

// testList checks a backend's Lister, when it has one: pages in key order,
// held keys only.
func testList(t *testing.T, b *Backend) {
	holder, observer := b.NewLocker(t), b.NewLocker(t)
	ls, ok := observer.(driver.Lister)
	if !ok {
		t.Skip("the backend does not implement driver.Lister")
	}
	ctx := b.ctx(t)
	prefix := key(t) + "/"
	o := b.opts(false)
	o.Owner = "lister"
	var leases []driver.Lease
	for _, k := range []string{"c", "a", "b", "d"} {
		leases = append(leases, mustAcquire(t, holder, ctx, prefix+k, o))
	}
	release(t, leases[3]) // d: released, so not listed
	list := func(after string, limit int) []driver.Listed {
		t.Helper()
		got, err := ls.List(ctx, prefix, after, limit)
		if err != nil {
			t.Fatalf("List(%q, %q, %d): %v", prefix, after, limit, err)
		}
		return got
	}
	keys := func(page []driver.Listed) []string {
		var out []string
		for _, l := range page {
			out = append(out, l.Key)
		}
		return out
	}
	b.eventually(t, "the released key leaves the list", func() bool { return len(list("", 10)) == 3 })
	first := list("", 2)
	if got := keys(first); len(got) != 2 || got[0] != prefix+"a" || got[1] != prefix+"b" {
		t.Fatalf("first page %q, want %sa and %sb", got, prefix, prefix)
	}
	if len(first[0].Holders) != 1 || first[0].Holders[0].Owner != "lister" || first[0].Holders[0].Token != leases[1].Token() {
		t.Fatalf("listed holder %+v, want owner lister and token %d", first[0].Holders, leases[1].Token())
	}
	if got := keys(list(prefix+"b", 2)); len(got) != 1 || got[0] != prefix+"c" {
		t.Fatalf("second page %q, want only %sc", got, prefix)
	}
	for _, l := range leases[:3] {
		release(t, l)
	}
}

// testForceRelease checks a backend's ForceReleaser, when it has one: the
// holder is removed and reported, the next grant's token is greater, the
// old lease is found gone, and a RevocableLease reports its revocation.
func testForceRelease(t *testing.T, b *Backend) {
	holder, admin, next := b.NewLocker(t), b.NewLocker(t), b.NewLocker(t)
	fr, ok := admin.(driver.ForceReleaser)
	if !ok {
		t.Skip("the backend does not implement driver.ForceReleaser")
	}
	ctx := b.ctx(t)
	k := key(t)
	if got, err := fr.ForceRelease(ctx, k); err != nil || len(got) != 0 {
		t.Fatalf("ForceRelease of a free key: %+v, %v; want no holders and no error", got, err)
	}
	old := mustAcquire(t, holder, ctx, k, b.opts(false))
	revoked := make(chan struct{})
	rl, revocable := old.(driver.RevocableLease)
	if revocable {
		rl.OnRevoke(func() { close(revoked) })
	}
	got, err := fr.ForceRelease(ctx, k)
	if err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	if len(got) != 1 || got[0].Token != old.Token() {
		t.Fatalf("ForceRelease removed %+v, want the holder with token %d", got, old.Token())
	}
	lease := mustAcquire(t, next, ctx, k, b.opts(false))
	if lease.Token() <= old.Token() {
		t.Fatalf("token %d after a forced release, not greater than the old holder's %d", lease.Token(), old.Token())
	}
	if revocable {
		// The holder's session lives on: only the revocation tells it.
		select {
		case <-revoked:
		case <-time.After(10 * time.Second):
			t.Fatal("OnRevoke's function was not called within 10s of the forced release")
		}
		late := make(chan struct{})
		rl.OnRevoke(func() { close(late) })
		select {
		case <-late:
		case <-time.After(10 * time.Second):
			t.Fatal("OnRevoke registered after the revocation was not called")
		}
	}
	if _, session := old.(driver.SessionLease); !session {
		if err := old.Refresh(ctx, b.ttl()); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("the old holder's Refresh after a forced release: %v, want ErrNotHeld", err)
		}
	}
	if err := old.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("the old holder's Release after a forced release: %v, want ErrNotHeld", err)
	}
	release(t, lease)
}

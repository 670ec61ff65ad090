package drivertest

import (
	"errors"
	"fmt"
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
	o := b.held(false)
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
// holding named is removed and reported, the next grant's token is greater,
// the old lease is found gone, and a RevocableLease reports its revocation;
// a holding that is no longer there is refused, naming the holder found
// instead, which keeps its lock; and of a shared lock's holders exactly the
// one named goes.
func testForceRelease(t *testing.T, b *Backend) {
	if _, ok := b.NewLocker(t).(driver.ForceReleaser); !ok {
		t.Skip("the backend does not implement driver.ForceReleaser")
	}
	t.Run("Named", func(t *testing.T) { testForceReleaseNamed(t, b) })
	t.Run("ChangedHands", func(t *testing.T) { testForceReleaseChangedHands(t, b) })
	t.Run("Shared", func(t *testing.T) { testForceReleaseShared(t, b) })
}

func testForceReleaseNamed(t *testing.T, b *Backend) {
	holder, admin, next := b.NewLocker(t), b.NewLocker(t), b.NewLocker(t)
	fr := admin.(driver.ForceReleaser)
	ctx := b.ctx(t)
	k := key(t)
	for _, target := range []driver.ReleaseTarget{{Token: 1}, {AnyHolder: true}} {
		if got, err := fr.ForceRelease(ctx, k, target); err != nil || len(got) != 0 {
			t.Fatalf("ForceRelease(%+v) of a free key: %+v, %v; want no holders and no error", target, got, err)
		}
	}
	o := b.opts(false)
	o.Owner = "hung-replica"
	old := mustAcquire(t, holder, ctx, k, o)
	revoked := make(chan struct{})
	rl, revocable := old.(driver.RevocableLease)
	if revocable {
		rl.OnRevoke(func() { close(revoked) })
	}
	got, err := fr.ForceRelease(ctx, k, driver.ReleaseTarget{Token: old.Token(), Owner: o.Owner})
	if err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	if len(got) != 1 || got[0].Token != old.Token() || got[0].Owner != o.Owner {
		t.Fatalf("ForceRelease removed %+v, want the holder %q with token %d", got, o.Owner, old.Token())
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

// testForceReleaseChangedHands: an operator saw holder A; A left and B took
// the lock before the release came. The release of A must not take B's
// lock, whatever the token or label it names, and must say who holds it;
// only AnyHolder takes it.
func testForceReleaseChangedHands(t *testing.T, b *Backend) {
	la, lb, admin := b.NewLocker(t), b.NewLocker(t), b.NewLocker(t)
	fr := admin.(driver.ForceReleaser)
	ctx := b.ctx(t)
	k := key(t)
	// Long enough that B's lease cannot run out during the test on a slow
	// machine, which would hide a wrongful removal.
	oa, ob := b.opts(false), b.opts(false)
	oa.TTL, ob.TTL = 20*b.ttl(), 20*b.ttl()
	oa.Owner, ob.Owner = "replica-a", "replica-b \"quoted\""
	a := mustAcquire(t, la, ctx, k, oa)
	seen := driver.ReleaseTarget{Token: a.Token(), Owner: oa.Owner}
	release(t, a)
	bl := mustAcquire(t, lb, ctx, k, ob)
	revoked := make(chan struct{})
	if rl, ok := bl.(driver.RevocableLease); ok {
		rl.OnRevoke(func() { close(revoked) })
	}
	for _, target := range []driver.ReleaseTarget{
		seen,
		{Token: a.Token()},
		{Token: bl.Token(), Owner: oa.Owner}, // B's token, A's label: not the holding seen
	} {
		got, err := fr.ForceRelease(ctx, k, target)
		if !errors.Is(err, driver.ErrHolderChanged) || len(got) != 0 {
			t.Fatalf("ForceRelease(%+v) with B holding: %+v, %v; want ErrHolderChanged and nothing removed", target, got, err)
		}
		var hc *driver.HolderChangedError
		if !errors.As(err, &hc) || len(hc.Holders) != 1 || hc.Holders[0].Token != bl.Token() || hc.Holders[0].Owner != ob.Owner {
			t.Fatalf("ForceRelease(%+v) refused with %v; want it to name B (token %d)", target, err, bl.Token())
		}
		want := fmt.Sprintf("the lock changed hands: now held by %q with token %d", ob.Owner, bl.Token())
		if err.Error() != want {
			t.Fatalf("refusal %q, want %q", err, want)
		}
	}
	if _, session := bl.(driver.SessionLease); !session {
		if err := bl.Refresh(ctx, ob.TTL); err != nil {
			t.Fatalf("B's Refresh after the refused releases: %v, want its lock kept", err)
		}
	}
	select {
	case <-revoked:
		t.Fatal("B's lease reported a revocation after releases that were refused")
	default:
	}
	if in, ok := admin.(driver.Inspector); ok {
		got, err := in.Inspect(ctx, k)
		if err != nil || len(got.Holders) != 1 || got.Holders[0].Token != bl.Token() {
			t.Fatalf("Inspect after the refused releases: %+v, %v; want B (token %d) holding", got, err, bl.Token())
		}
	}
	got, err := fr.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true})
	if err != nil || len(got) != 1 || got[0].Token != bl.Token() {
		t.Fatalf("ForceRelease(AnyHolder): %+v, %v; want B (token %d) removed", got, err, bl.Token())
	}
	if err := bl.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("B's Release after ForceRelease(AnyHolder): %v, want ErrNotHeld", err)
	}
}

// testForceReleaseShared: of a key's shared holders (readers, permits) that
// Inspect reports, the release of one removes that one and keeps the
// others. A backend whose Inspect does not report them on the lock's key
// has nothing to check here.
func testForceReleaseShared(t *testing.T, b *Backend) {
	l1, l2, admin := b.NewLocker(t), b.NewLocker(t), b.NewLocker(t)
	fr := admin.(driver.ForceReleaser)
	in, ok := admin.(driver.Inspector)
	if !ok {
		t.Skip("the backend does not implement driver.Inspector, so no holder can be named from what it shows")
	}
	ctx := b.ctx(t)
	o1, o2 := b.opts(false), b.opts(false)
	o1.TTL, o2.TTL = 20*b.ttl(), 20*b.ttl()
	o1.Owner, o2.Owner = "reader-1", "reader-2"
	checked := 0
	try := func(kind string, acquire func(l driver.Locker, k string, o driver.AcquireOptions) (driver.Lease, error)) {
		t.Helper()
		k := key(t)
		first, err := acquire(l1, k, o1)
		if err != nil {
			t.Fatalf("%s on %q: %v", kind, k, err)
		}
		second, err := acquire(l2, k, o2)
		if err != nil {
			t.Fatalf("a second %s on %q: %v", kind, k, err)
		}
		seen, err := in.Inspect(ctx, k)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", k, err)
		}
		if len(seen.Holders) < 2 {
			t.Logf("%s: Inspect reports %d of 2 holders, so a release cannot name both", kind, len(seen.Holders))
			release(t, first)
			release(t, second)
			return
		}
		checked++
		// The newer holder is named: a backend that removed every holder,
		// or the oldest, fails.
		got, err := fr.ForceRelease(ctx, k, driver.ReleaseTarget{Token: second.Token(), Owner: o2.Owner})
		if err != nil || len(got) != 1 || got[0].Token != second.Token() || got[0].Owner != o2.Owner {
			t.Fatalf("%s: ForceRelease of the second holder: %+v, %v; want it alone (token %d)", kind, got, err, second.Token())
		}
		after, err := in.Inspect(ctx, k)
		if err != nil || len(after.Holders) != 1 || after.Holders[0].Token != first.Token() {
			t.Fatalf("%s: Inspect after the release of the second holder: %+v, %v; want the first (token %d) alone", kind, after, err, first.Token())
		}
		if err := second.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("%s: the released holder's Release: %v, want ErrNotHeld", kind, err)
		}
		release(t, first) // fails the test if the first holder lost its lease
	}
	if _, ok := l1.(driver.RWLocker); ok {
		try("AcquireRead", func(l driver.Locker, k string, o driver.AcquireOptions) (driver.Lease, error) {
			return l.(driver.RWLocker).AcquireRead(ctx, k, o)
		})
	}
	if _, ok := l1.(driver.Semaphorer); ok {
		try("AcquireSemaphore", func(l driver.Locker, k string, o driver.AcquireOptions) (driver.Lease, error) {
			return l.(driver.Semaphorer).AcquireSemaphore(ctx, k, 2, o)
		})
	}
	if checked == 0 {
		t.Skip("the backend's Inspect reports no shared holders on a lock's key")
	}
}

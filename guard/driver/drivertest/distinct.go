package drivertest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/warden-go/warden/guard/driver"
)

// lookalikes are key suffixes that differ only in ways a store might not
// see: trailing spaces (SQL's PAD SPACE collations), letter case
// (case-insensitive collations) and Unicode normalisation (é as one code
// point, NFC, and as e with a combining accent, NFD). Keys are bytes: each
// is a lock of its own.
var lookalikes = []string{"k", "k ", "k  ", "K", "\u00e9", "e\u0301"}

// testDistinctKeys checks that keys differing only as lookalikes do are
// distinct locks for Acquire and, where the backend offers them, for
// Inspect, List and ForceRelease.
func testDistinctKeys(t *testing.T, b *Backend) {
	ctx := b.ctx(t)
	holder, other := b.NewLocker(t), b.NewLocker(t)
	base := key(t) + "/"
	keys := make([]string, len(lookalikes))
	owners := make([]string, len(lookalikes))
	leases := make([]driver.Lease, len(lookalikes))
	for i, s := range lookalikes {
		keys[i], owners[i] = base+s, fmt.Sprintf("holder of %q", s)
		o := b.held(false)
		o.Owner = owners[i]
		// Taken while its lookalikes are held: a store that folds them
		// together answers ErrNotAcquired here.
		lease, err := holder.Acquire(ctx, keys[i], o)
		if err != nil {
			t.Fatalf("Acquire(%q) while %q are held: %v", keys[i], lookalikes[:i], err)
		}
		leases[i] = lease
	}
	for _, k := range keys {
		expectNotAcquired(t, other, ctx, k, b.opts(false))
	}

	if in, ok := other.(driver.Inspector); ok {
		for i, k := range keys {
			got, err := in.Inspect(ctx, k)
			if err != nil {
				t.Fatalf("Inspect(%q): %v", k, err)
			}
			if len(got.Holders) != 1 || got.Holders[0].Owner != owners[i] || got.Holders[0].Token != leases[i].Token() {
				t.Errorf("Inspect(%q): %+v, want the one holder %q with token %d", k, got.Holders, owners[i], leases[i].Token())
			}
		}
	}
	if ls, ok := other.(driver.Lister); ok {
		got, err := ls.List(ctx, base, "", 2*len(keys))
		if err != nil {
			t.Fatalf("List(%q): %v", base, err)
		}
		seen := make(map[string]string)
		for _, l := range got {
			if len(l.Holders) == 1 {
				seen[l.Key] = l.Holders[0].Owner
			}
		}
		if len(got) != len(keys) {
			t.Errorf("List(%q) gave %d keys, want the %d lookalikes", base, len(got), len(keys))
		}
		for i, k := range keys {
			if seen[k] != owners[i] {
				t.Errorf("List(%q): key %q held by %q, want %q", base, k, seen[k], owners[i])
			}
		}
	}
	fr, ok := other.(driver.ForceReleaser)
	if !ok {
		for _, lease := range leases {
			release(t, lease)
		}
		return
	}
	// Forcing one key free takes its holder away and no other: the rest
	// stay held, and their own releases succeed.
	const forced = 1
	took, err := fr.ForceRelease(ctx, keys[forced], driver.ReleaseTarget{Token: leases[forced].Token(), Owner: owners[forced]})
	if err != nil {
		t.Fatalf("ForceRelease(%q): %v", keys[forced], err)
	}
	if len(took) != 1 || took[0].Owner != owners[forced] || took[0].Token != leases[forced].Token() {
		t.Errorf("ForceRelease(%q) took %+v, want only %q with token %d", keys[forced], took, owners[forced], leases[forced].Token())
	}
	for i, k := range keys {
		if i == forced {
			continue
		}
		expectNotAcquired(t, other, ctx, k, b.opts(false))
		if err := leases[i].Release(ctx); err != nil {
			t.Errorf("Release(%q) after ForceRelease(%q): %v", k, keys[forced], err)
		}
	}
	if err := leases[forced].Release(ctx); err != nil && !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release(%q) after it was forced free: %v, want ErrNotHeld", keys[forced], err)
	}
	release(t, mustAcquire(t, other, ctx, keys[forced], b.opts(false)))
}

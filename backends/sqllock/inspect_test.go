package sqllock

import (
	"strconv"
	"strings"
	"testing"
)

// TestLabelled: the label comes back from any owner value labelled builds,
// which always fits the owner column and stays unique to its id.
func TestLabelled(t *testing.T) {
	long := strings.Repeat("h", 200) + "/18446744073709551615"
	label := strings.Repeat("é", 64) // 128 bytes, driver.MaxOwnerLen
	for _, c := range []struct{ id, label string }{
		{"host:1:abcd/1", "replica-7 (eu)"},
		{"host:1:abcd/2", ""},
		{"with\ttab/3", "a/b\\c\"d"},
		{long, label},
		{long, ""},
	} {
		owner := labelled(c.id, c.label)
		if got := labelOf(owner); got != c.label {
			t.Errorf("labelOf(labelled(%q, %q)) = %q", c.id, c.label, got)
		}
		if len(owner) > ownerWidth {
			t.Errorf("labelled(%q, %q) is %d bytes, more than the column's %d", c.id, c.label, len(owner), ownerWidth)
		}
	}
	if a, b := labelled(long, label), labelled(long[:len(long)-1]+"4", label); a == b {
		t.Errorf("two long ids share the owner value %q", a)
	}
	if got := labelOf("host:1:abcd/1"); got != "" {
		t.Errorf("a row written without a label reads as labelled %q", got)
	}
}

// TestLeaseOwner: a lease's owner value is its Locker's id, a counter and
// the label, as labelled writes them, whether or not the id leaves room for
// the label, and the counter makes each one new.
func TestLeaseOwner(t *testing.T) {
	label := strings.Repeat("é", 64)
	for _, id := range []string{"host:1:abcd", strings.Repeat("h", 200)} {
		l := &Locker{owner: id}
		for _, lb := range []string{"", "replica-7", label} {
			seq := l.seq.Add(1)
			want := labelled(id+"/"+strconv.FormatUint(seq, 10), lb)
			if got := l.ownerOf(seq, lb); got != want {
				t.Errorf("ownerOf(%d, %q) of %q = %q, want %q", seq, lb, id, got, want)
			}
		}
	}
}

package driver_test

import (
	"errors"
	"testing"

	"github.com/warden-go/warden/guard/driver"
)

// TestCheckOwnerRefusesWhatRewritesATerminal: C1 controls (CSI U+009B
// starts an escape sequence on many terminals) and bidirectional controls
// (which make "evil" read as "live") are refused as C0 controls are.
func TestCheckOwnerRefusesWhatRewritesATerminal(t *testing.T) {
	for _, owner := range []string{
		"a\x1b[2Jb", "a\x7fb", "a\u0080b", "a\u009b31mb", "a\u009fb",
		"a\u202eb", "a\u202ab", "a\u2066b", "a\u2069b", "a\u200eb", "a\u200fb", "a\u061cb",
	} {
		if err := driver.CheckOwner(owner); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("CheckOwner(%q) = %v, want ErrInvalidOption", owner, err)
		}
	}
	for _, owner := range []string{"", "orders-svc/7", "api-3:host", "é ü 日本", "a\u00a0b", "a\u200db"} {
		if err := driver.CheckOwner(owner); err != nil {
			t.Errorf("CheckOwner(%q) = %v, want nil", owner, err)
		}
	}
}

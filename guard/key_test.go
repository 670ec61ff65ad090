package guard_test

import (
	"errors"
	"testing"

	"github.com/warden-go/warden/guard"
)

// TestValidateKeyRefusesBidiControls: a key with a right-to-left override
// prints as another key ("orders/\u202eesolc" reads "orders/close").
func TestValidateKeyRefusesBidiControls(t *testing.T) {
	for _, key := range []string{"orders/\u202eesolc", "a\u202ab", "a\u2066b", "a\u2069b", "a\u200eb", "a\u200fb", "a\u061cb", "a\u0085b", "a\x1bb"} {
		if err := guard.ValidateKey(key); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	for _, key := range []string{"orders/close", "user:42", "é/日本", "a b"} {
		if err := guard.ValidateKey(key); err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", key, err)
		}
	}
}

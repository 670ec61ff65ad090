package redistag

import "testing"

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"orders/close": "orders/close",
		"a{b}c":        "a%7Bb%7Dc",
		"100%":         "100%25",
		"%7B":          "%257B", // not confused with an escaped '{'
		"":             "",
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}

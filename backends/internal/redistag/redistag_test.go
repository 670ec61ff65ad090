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

func TestUnescapeInvertsEscape(t *testing.T) {
	for _, in := range []string{"orders/close", "a{b}c", "100%", "%7B", "", "%", "}{%%"} {
		got, ok := Unescape(Escape(in))
		if !ok || got != in {
			t.Errorf("Unescape(Escape(%q)) = %q, %v", in, got, ok)
		}
	}
	for _, bad := range []string{"%", "%7", "%41", "a{b"} {
		if _, ok := Unescape(bad); ok {
			t.Errorf("Unescape(%q) accepted text Escape never makes", bad)
		}
	}
}

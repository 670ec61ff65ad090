package guard

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/warden-go/warden/guard/driver"
)

// MaxKeyLen bounds a key (before the guard's prefix is added), so that every
// backend can store it: etcd keys, ZooKeeper node names and indexed SQL
// columns all have limits.
const MaxKeyLen = 200

// ValidateKey reports why key cannot be used as a lock key, or nil. A key is
// 1 to MaxKeyLen bytes of valid UTF-8 with no control characters and no
// bidirectional controls (driver.Unsafe), so that it prints as it is.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return checkText(key, false)
}

// checkText reports the first byte of s that no key may hold: invalid
// UTF-8, a control character or a bidirectional control (driver.Unsafe).
// With open, s may end partway through a rune, as the start of a key may.
func checkText(s string, open bool) error {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 {
			if open && !utf8.FullRuneInString(s[i:]) {
				return nil // the first bytes of a rune, and nothing after them
			}
			return fmt.Errorf("%w: invalid UTF-8 at byte %d", ErrInvalidKey, i)
		}
		if driver.Unsafe(r) {
			return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidKey, r, i)
		}
		i += size
	}
	return nil
}

// quote shows a key in messages; keys that fail validation may be long or
// binary, so they are cut.
func quote(key string) string {
	if len(key) > MaxKeyLen {
		key = key[:MaxKeyLen] + "..."
	}
	return strconv.Quote(key)
}

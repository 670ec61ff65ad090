package httpmw

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyLen bounds an idempotency key, in characters (all ASCII).
const MaxKeyLen = 255

// errBadKey is wrapped by every ParseKey error.
var errBadKey = errors.New("invalid idempotency key")

// ParseKey parses the value of an Idempotency-Key field. The draft defines it
// as a Structured Field string (RFC 8941 section 3.3.3), "key" in quotes;
// since many clients send the bare key, a value that does not start with a
// quote is taken as the key itself when it is a run of visible ASCII other
// than quotes, backslashes and commas (a comma would mean a proxy folded two
// fields into one). Either way the key is 1 to MaxKeyLen characters.
// Parameters after an sf-string are refused: the draft defines none.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", errBadKey)
	}
	var key string
	if v[0] == '"' {
		var err error
		if key, err = parseSFString(v); err != nil {
			return "", err
		}
	} else {
		for i := range len(v) {
			if c := v[i]; c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == ',' {
				return "", fmt.Errorf("%w: byte 0x%02x at %d of an unquoted key", errBadKey, c, i)
			}
		}
		key = v
	}
	if key == "" {
		return "", fmt.Errorf("%w: empty", errBadKey)
	}
	if len(key) > MaxKeyLen {
		return "", fmt.Errorf("%w: %d characters, more than %d", errBadKey, len(key), MaxKeyLen)
	}
	return key, nil
}

// excerptLen bounds how much of a client's bad value an error repeats: the
// error goes back to the client in a 400 and into logs, where an echo of
// the whole value would let a client fill them with what it likes.
const excerptLen = 16

// excerpt quotes (escaping every non-printable byte) at most excerptLen
// bytes of s, marking a cut with "...".
func excerpt(s string) string {
	if len(s) <= excerptLen {
		return fmt.Sprintf("%+q", s)
	}
	return fmt.Sprintf("%+q...", s[:excerptLen])
}

// parseSFString parses v, which starts with a quote, as exactly one sf-string.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape at %d", errBadKey, i)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: unexpected %s after the closing quote", errBadKey, excerpt(v[i+1:]))
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: byte 0x%02x at %d", errBadKey, c, i)
		default:
			b.WriteByte(c)
		}
		if b.Len() > MaxKeyLen {
			return "", fmt.Errorf("%w: more than %d characters", errBadKey, MaxKeyLen)
		}
	}
	return "", fmt.Errorf("%w: no closing quote", errBadKey)
}

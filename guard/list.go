package guard

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/warden-go/warden/guard/driver"
)

// List pages through the held locks whose keys (in the Guard's namespace)
// start with prefix, in key order, beginning after the key after ("" for
// the first page), at most limit of them (1 to 1000).
//
// A prefix or an after is what could start or be a key in the namespace:
// the keys of a Guard with a longer prefix are listed too (a Guard made
// WithPrefix("") sees every Guard's), so with the Guard's prefix it may be
// as long as a prefix and a key together (2*MaxKeyLen bytes), and it may
// end partway through a rune ("caf\xc3" starts "café"). Anything else (a
// control character, invalid UTF-8 before the end, more bytes) is an
// error wrapping ErrInvalidKey, rather than a question a backend answers
// with nothing, or with an error that looks like an outage. A backend is
// never sent a rune cut short (a SQL database refuses invalid UTF-8): it is
// asked about the whole runes, and List keeps what matches. It needs a
// backend that implements driver.Lister; ErrUnsupported otherwise.
func (g *Guard) List(ctx context.Context, prefix, after string, limit int) ([]Inspection, error) {
	if ctx == nil {
		return nil, fmt.Errorf("warden: list: %w: nil context", ErrInvalidOption)
	}
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("warden: list: %w: limit %d, want 1 to 1000", ErrInvalidOption, limit)
	}
	for _, arg := range [...]struct{ name, s string }{{"prefix", prefix}, {"after", after}} {
		if err := g.checkListArg(arg.s); err != nil {
			return nil, fmt.Errorf("warden: list: %s %s: %w", arg.name, quote(arg.s), err)
		}
	}
	ls, ok := g.locker.(driver.Lister)
	if !ok {
		return nil, fmt.Errorf("warden: list: %w: listing on %s", ErrUnsupported, g.backend)
	}
	from := ""
	if after != "" {
		from = g.prefix + after
	}
	page, err := bounded(g, ctx, func(lctx context.Context) ([]driver.Listed, error) {
		return listWhole(lctx, ls, g.prefix+prefix, from, limit)
	})
	if err != nil {
		return nil, fmt.Errorf("warden: list: %w", err)
	}
	out := make([]Inspection, len(page))
	for i, p := range page {
		out[i] = Inspection{Key: strings.TrimPrefix(p.Key, g.prefix), Holders: p.Holders, Waiters: p.Waiters}
	}
	return out, nil
}

// checkListArg reports why s, a prefix or an after of List, could neither
// start nor be a key in the Guard's namespace.
func (g *Guard) checkListArg(s string) error {
	if n := len(g.prefix) + len(s); n > 2*MaxKeyLen {
		return fmt.Errorf("%w: %d bytes with the prefix %s, more than the %d of a prefix and a key",
			ErrInvalidKey, n, quote(g.prefix), 2*MaxKeyLen)
	}
	return checkText(s, true)
}

// listWhole lists as ls.List does, prefix and after being full keys or
// their starts, which may end partway through a rune. The backend is asked
// about their whole runes only, from the last key before every match, and
// page after page until limit keys match or none is left to.
func listWhole(ctx context.Context, ls driver.Lister, prefix, after string, limit int) ([]driver.Listed, error) {
	qprefix, cut := wholeRunes(prefix)
	qafter, afterCut := wholeRunes(after)
	if cut == "" && afterCut == "" {
		return ls.List(ctx, prefix, after, limit)
	}
	if cut != "" {
		// Skip the keys that start with qprefix but sort before every key
		// that starts with prefix.
		qafter = max(qafter, qprefix+string(lastRuneBefore(cut)))
	}
	var out []driver.Listed
	for {
		page, err := ls.List(ctx, qprefix, qafter, limit)
		if err != nil {
			return nil, err
		}
		for _, p := range page {
			switch {
			case strings.HasPrefix(p.Key, prefix) && p.Key > after:
				out = append(out, p)
				if len(out) == limit {
					return out, nil
				}
			case p.Key > prefix && !strings.HasPrefix(p.Key, prefix):
				return out, nil // past every key that starts with prefix
			}
		}
		if len(page) < limit {
			return out, nil
		}
		qafter = page[len(page)-1].Key
	}
}

// wholeRunes splits s, valid UTF-8 but for its last rune, into its whole
// runes and the start of a rune after them ("" when there is none).
func wholeRunes(s string) (whole, cut string) {
	for n := 1; n < utf8.UTFMax && n <= len(s); n++ {
		if utf8.RuneStart(s[len(s)-n]) {
			if !utf8.FullRuneInString(s[len(s)-n:]) {
				return s[:len(s)-n], s[len(s)-n:]
			}
			break
		}
	}
	return s, ""
}

// lastRuneBefore is the greatest rune whose encoding sorts before every
// encoding that starts with cut, the first bytes of a rune.
func lastRuneBefore(cut string) rune {
	b := []byte(cut)
	for !utf8.FullRune(b) {
		next := byte(0x80) // the least continuation byte, but after E0 and F0
		if len(b) == 1 && b[0] == 0xe0 {
			next = 0xa0
		} else if len(b) == 1 && b[0] == 0xf0 {
			next = 0x90
		}
		b = append(b, next)
	}
	first, _ := utf8.DecodeRune(b)
	if r := first - 1; !utf8.ValidRune(r) {
		return 0xd7ff // the last rune before the surrogates
	}
	return first - 1
}

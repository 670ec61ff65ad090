package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
// with nothing, or with an error that looks like an outage; a backend
// takes any bytes that pass (driver.Lister). It needs a backend that
// implements driver.Lister; ErrUnsupported otherwise.
//
// A lock the backend shows to exist but refuses to let this Guard's client
// read (another user's, under a ZooKeeper ACL that lets it list the lock
// parents but not read that one, or a Redis ACL user's key patterns, which
// SCAN does not apply) does not fail the page: it is listed in its place,
// counted in limit, with Err set to the backend's refusal (wrapping
// ErrUnavailable, and zk.ErrNoAuth or Redis's NOPERM) and no holders. Such
// an entry says nothing of whether the lock is held: it may be one nobody
// holds any longer (Redis keeps a lock's keys about a day after its last
// holder, ZooKeeper a lock's node until it is removed).
//
// A backend that leaves such locks out and says only that it did (Consul,
// whose ACLs filter a read) returns the page it could read together with an
// error matching ErrPartialList, as an io.Reader returns n bytes and an
// error: the page is not the whole answer, however short, and is right as
// far as it goes but for the keys left out: an entry they could make wrong
// has Err (on Consul, a read/write lock or semaphore), and one read held may
// have more waiters than it shows. Any other failure (the backend out of
// reach, a refusal of the listing itself) fails the page, and returns none.
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
		return ls.List(lctx, g.prefix+prefix, from, limit)
	})
	if err != nil {
		err = fmt.Errorf("warden: list: %w", err)
		if !errors.Is(err, ErrPartialList) {
			return nil, err
		}
	}
	out := make([]Inspection, len(page))
	for i, p := range page {
		key := strings.TrimPrefix(p.Key, g.prefix)
		out[i] = Inspection{Key: key, Holders: p.Holders, Waiters: p.Waiters}
		if p.Err != nil {
			out[i].Err = wrapLockErr(key, p.Err)
		}
	}
	return out, err
}

// ErrPartialList comes with a List page from which the backend left out
// locks this Guard's client may not read, saying that it did but not
// which: such locks may be missing between and after the page's entries.
var ErrPartialList = driver.ErrPartialList

// checkListArg reports why s, a prefix or an after of List, could neither
// start nor be a key in the Guard's namespace.
func (g *Guard) checkListArg(s string) error {
	if n := len(g.prefix) + len(s); n > 2*MaxKeyLen {
		return fmt.Errorf("%w: %d bytes with the prefix %s, more than the %d of a prefix and a key",
			ErrInvalidKey, n, quote(g.prefix), 2*MaxKeyLen)
	}
	return checkText(s, true)
}

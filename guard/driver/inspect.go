package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Inspector is an optional capability: reporting who holds a lock without
// taking it, for leader observation and for operators.
type Inspector interface {
	// Inspect reports key's current holders. An unheld key is not an error:
	// its Inspection has no holders. key is a lock key as Acquire gets it.
	Inspect(ctx context.Context, key string) (Inspection, error)
}

// Inspection is what an Inspector saw of one key, in one consistent read
// where the backend allows it.
type Inspection struct {
	// Holders are the live holders, oldest grant first: one for a mutex,
	// several for read locks or a semaphore.
	Holders []Holding
	// Waiters counts the contenders queued on the server, or is -1 where
	// the backend does not queue them (its waiters poll or listen).
	Waiters int
}

// Holding is one live holder of a key.
type Holding struct {
	// Owner is the label the holder acquired with (AcquireOptions.Owner),
	// empty when it gave none.
	Owner string `json:"owner"`
	// Token is the holder's fencing token.
	Token uint64 `json:"token"`
	// TTL is what was left of the lease on the server's clock when it
	// answered. It is 0 for a lease that lives as long as its holder's
	// session (SessionBound).
	TTL time.Duration `json:"ttl_ns"`
	// SessionBound: the lease ends with its holder's session (a ZooKeeper
	// ephemeral node, an etcd session lease, a database connection), not at
	// a time of its own.
	SessionBound bool `json:"session_bound"`
}

// MaxOwnerLen bounds AcquireOptions.Owner, so that backends can keep it
// beside the lease in a key, a node or a column of fixed width.
const MaxOwnerLen = 128

// CheckOwner reports why owner cannot label a lease, as an error wrapping
// ErrInvalidOption, or nil: it must be UTF-8 of at most MaxOwnerLen bytes
// without a rune Unsafe refuses. Empty is valid (no label).
func CheckOwner(owner string) error {
	if len(owner) > MaxOwnerLen {
		return fmt.Errorf("%w: owner label of %d bytes, more than %d", ErrInvalidOption, len(owner), MaxOwnerLen)
	}
	if !utf8.ValidString(owner) {
		return fmt.Errorf("%w: owner label %q is not UTF-8", ErrInvalidOption, owner)
	}
	for _, r := range owner {
		if Unsafe(r) {
			return fmt.Errorf("%w: owner label %q has control character %U", ErrInvalidOption, owner, r)
		}
	}
	return nil
}

// Unsafe reports whether r may not appear in an owner label or a lock key:
// a C0 or C1 control or DEL, which a terminal obeys, or a bidirectional
// mark, embedding, override or isolate, which reorders the text around it
// so that an operator reads another key or owner than the one there.
func Unsafe(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Lister is an optional capability: paging through the held locks, for
// operators.
type Lister interface {
	// List returns up to limit held locks whose keys start with prefix, in
	// ascending key order (by bytes), beginning after the key after ("" for
	// the first page). A key with no live holder is left out. limit is at
	// least 1. prefix and after are a key's start or a whole key, and may
	// end partway through a rune ("caf\xc3", the start of "café"): a
	// backend whose engine refuses invalid UTF-8 compares them as bytes.
	//
	// A lock the server shows to exist but refuses to let the caller read
	// (another user's, under an ACL that lets the caller list the keys but
	// not read that one) is on the page with Err set, in its place in key
	// order and counted in limit, rather than failing the whole page: an
	// operator must see the others, and see that it is there. An error
	// that is not the one key's (the server out of reach) fails the page.
	//
	// A server that leaves out of its answer the locks the caller may not
	// read, and says that it did but not which (Consul's ACLs), gives no
	// key to stand for them: List then returns the page it could read
	// together with an error matching ErrPartialList, as an io.Reader
	// returns n bytes and an error. Every other error comes with no page.
	List(ctx context.Context, prefix, after string, limit int) ([]Listed, error)
}

// ErrPartialList comes with a List page from which the server left out
// locks the caller may not read, saying that it did but not which. The
// page is in key order and right as far as it goes, but such locks may be
// missing between and after its entries, so the page, even a short one,
// is not the whole answer; the pages after it may be partial too.
var ErrPartialList = errors.New("the server left out of the list locks this client may not read")

// Listed is one held lock in a List page, or one that could not be read.
type Listed struct {
	// Key is the lock key, as Acquire got it.
	Key string
	Inspection
	// Err, when not nil, says why the lock under Key could not be
	// inspected, with the server's own error (ZooKeeper's zk.ErrNoAuth,
	// Redis's NOPERM) wrapped for errors.Is; the Inspection is then
	// empty, and says nothing of whether the lock is held.
	Err error
}

// ForceReleaser is an optional capability: an operator taking a lock away
// from its holder (one that hangs, or whose process is gone but whose lease
// is long).
type ForceReleaser interface {
	// ForceRelease removes from key (a plain or fair lock, and where the
	// backend's Inspect reports them on the same key, its readers or
	// permits) the holding target names, and returns it: exactly that
	// holding, in one atomic step of the server that checks it still holds
	// (a script, a transaction's compare, a conditional delete or update),
	// never a read and a removal in two requests. When the key is held, but
	// not by that holding, it removes nothing and returns a
	// *HolderChangedError naming the holders it found, which matches
	// ErrHolderChanged; when the key is free, it returns none and no error.
	// With target.AnyHolder it removes every holder Inspect would report
	// when the server answers, whoever they are, in one step, or in
	// several where the server bounds a step (Consul's transactions): a
	// step that fails then returns the holdings the steps before it
	// removed, with its error.
	//
	// It first makes sure the next grant's token is greater than every token
	// issued so far, so that fenced storage refuses the removed holder's
	// later writes; a removed holder finds its lease gone at its next
	// renewal at the latest (for session-kept leases, see the backend's
	// documentation).
	//
	// A failure that proves nothing was removed (the request never left,
	// or the server refused it whole; see NotSent) matches ErrNotSent, and
	// comes with no holdings; any other may have come after the removal,
	// whose answer was lost.
	ForceRelease(ctx context.Context, key string, target ReleaseTarget) ([]Holding, error)
}

// ReleaseTarget names what a forced release removes: the holding an
// operator saw in an Inspection, or, only when asked for explicitly,
// whoever holds the key.
type ReleaseTarget struct {
	// Token is the fencing token of the holding to remove, as Inspect
	// reported it. Every backend's tokens tell its holdings of one key
	// apart, readers and permits included.
	Token uint64
	// Owner, when not empty, must be the holding's label as well
	// (Holding.Owner): a holding with Token but another label is not the
	// one the operator saw.
	Owner string
	// AnyHolder removes whoever holds the key when the server answers, and
	// ignores Token and Owner.
	AnyHolder bool
}

// Matches reports whether h is the holding t names (AnyHolder aside).
func (t ReleaseTarget) Matches(h Holding) bool {
	return h.Token == t.Token && (t.Owner == "" || h.Owner == t.Owner)
}

// ErrHolderChanged: a forced release found the lock held, but not by the
// holding it was told to remove, and removed nothing.
var ErrHolderChanged = errors.New("the lock changed hands")

// HolderChangedError is a forced release's refusal: the lock is held by
// others than the holding it named. It matches ErrHolderChanged.
type HolderChangedError struct {
	// Holders are the holders the backend found instead, oldest grant
	// first.
	Holders []Holding
}

// HolderChanged is the refusal of a forced release that found holders
// instead of the holding it was told to remove.
func HolderChanged(holders []Holding) error {
	return &HolderChangedError{Holders: holders}
}

// Error says who holds the lock now, with each label quoted so that no
// character of it reaches a terminal raw.
func (e *HolderChangedError) Error() string {
	var b strings.Builder
	b.WriteString(ErrHolderChanged.Error())
	b.WriteString(": now held by ")
	for i, h := range e.Holders {
		if i > 0 {
			b.WriteString(", ")
		}
		if h.Owner == "" {
			b.WriteString("an unlabelled holder")
		} else {
			b.WriteString(strconv.Quote(h.Owner))
		}
		b.WriteString(" with token ")
		b.WriteString(strconv.FormatUint(h.Token, 10))
	}
	return b.String()
}

// Is makes the error match ErrHolderChanged.
func (e *HolderChangedError) Is(target error) bool { return target == ErrHolderChanged }

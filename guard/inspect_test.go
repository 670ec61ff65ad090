package guard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

func TestInspectNeedsTheCapability(t *testing.T) {
	g := newGuard(t, withoutInspect{memory.New()})
	if _, err := g.Inspect(context.Background(), "k"); !errors.Is(err, guard.ErrUnsupported) {
		t.Fatalf("Inspect on a backend without it: %v, want ErrUnsupported", err)
	}
	if _, err := g.Observe(context.Background(), "e"); !errors.Is(err, guard.ErrUnsupported) {
		t.Fatalf("Observe on a backend without Inspect: %v, want ErrUnsupported", err)
	}
	if _, err := newGuard(t, memory.New()).Inspect(context.Background(), ""); !errors.Is(err, guard.ErrInvalidKey) {
		t.Fatalf("Inspect of an empty key: %v, want ErrInvalidKey", err)
	}
}

func TestInspectReportsHoldersAndWaiters(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	g := newGuard(t, mem, guard.WithOwner("worker-1"))
	in, err := g.Inspect(ctx, "k")
	if err != nil || len(in.Holders) != 0 || in.Key != "k" {
		t.Fatalf("free key: %+v, %v", in, err)
	}
	l, err := g.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if l2, err := newGuard(t, mem).Lock(ctx, "k"); err == nil {
			l2.Unlock(ctx)
		}
	}()
	waitFor(t, "a waiter queues", 5*time.Second, func() bool { return mem.Waiters("warden:k") == 1 })
	in, err = g.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Holders) != 1 || in.Holders[0].Owner != "worker-1" || in.Holders[0].Token != l.Token() || in.Waiters != 1 {
		t.Fatalf("held key: %+v, want worker-1 with token %d and 1 waiter", in, l.Token())
	}
	l.Unlock(ctx)
}

func TestOwnerLabelIsChecked(t *testing.T) {
	for _, bad := range []string{"tab\there", string(make([]byte, 200)), "\xff"} {
		if _, err := guard.New(memory.New(), guard.WithOwner(bad)); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("WithOwner(%q): %v, want ErrInvalidOption", bad, err)
		}
	}
	g := newGuard(t, memory.New())
	if g.Owner() == "" {
		t.Fatal("no default owner label")
	}
}

func TestHeldListsThisGuardsLocks(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, memory.New(), guard.WithTTL(time.Second))
	if h := g.Held(); len(h) != 0 {
		t.Fatalf("Held before any lock: %+v", h)
	}
	before := time.Now()
	b, err := g.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	a, err := g.Lock(ctx, "a", guard.Write())
	if err != nil {
		t.Fatal(err)
	}
	held := g.Held()
	if len(held) != 2 || held[0].Key != "a" || held[1].Key != "b" {
		t.Fatalf("Held = %+v, want a then b", held)
	}
	if held[0].Mode != "write" || held[0].Token != a.Token() || held[1].Token != b.Token() {
		t.Fatalf("Held = %+v, want a in write mode with token %d, b with %d", held, a.Token(), b.Token())
	}
	for _, h := range held {
		if h.Acquired.Before(before.Add(-time.Second)) || h.Acquired.After(time.Now()) || !h.Expiry.After(h.Acquired) || h.Renewed.Before(h.Acquired) {
			t.Fatalf("times of %+v do not fit a lock taken after %v", h, before)
		}
	}
	waitFor(t, "a renewal of b", 5*time.Second, func() bool {
		for _, h := range g.Held() {
			if h.Key == "b" && h.Renewed.After(h.Acquired) {
				return true
			}
		}
		return false
	})
	a.Unlock(ctx)
	b.Unlock(ctx)
	if h := g.Held(); len(h) != 0 {
		t.Fatalf("Held after unlocking everything: %+v", h)
	}
}

// A prefix or an after that no key could have is bad input, said so, not
// a page of nothing, nor an error that looks like an outage (PostgreSQL
// refuses invalid UTF-8 and NUL in its query).
func TestListRefusesWhatNoKeyCouldBe(t *testing.T) {
	g := newGuard(t, memory.New()) // prefix "warden:"
	ctx := context.Background()
	longest := 2*guard.MaxKeyLen - len("warden:")
	for _, bad := range []string{"\xff", "\xc3a", "caf\xc3\xa9\xff", "a\x00b", "jobs\u202e", strings.Repeat("p", longest+1)} {
		if _, err := g.List(ctx, bad, "", 10); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("List(prefix %.20q): %v, want ErrInvalidKey", bad, err)
		}
		if _, err := g.List(ctx, "", bad, 10); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("List(after %.20q): %v, want ErrInvalidKey", bad, err)
		}
	}
	if _, err := g.List(ctx, strings.Repeat("p", longest), strings.Repeat("a", longest), 10); err != nil {
		t.Errorf("List with a prefix and an after as long as a prefix and a key: %v", err)
	}
}

// A Guard over a wider namespace (WithPrefix("")) lists the keys of every
// Guard, longer than MaxKeyLen with their prefix: the last key of a page is
// the after of the next, and its start a prefix.
func TestListPagesAWiderNamespace(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	g := newGuard(t, mem) // "warden:"
	for _, k := range []string{strings.Repeat("a", guard.MaxKeyLen), strings.Repeat("b", guard.MaxKeyLen)} {
		l, err := g.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
	}
	all := newGuard(t, mem, guard.WithPrefix(""))
	first, err := all.List(ctx, "", "", 1)
	if err != nil || len(first) != 1 {
		t.Fatalf("first page: %v, %v", first, err)
	}
	next, err := all.List(ctx, "", first[0].Key, 1)
	if err != nil || len(next) != 1 || next[0].Key != "warden:"+strings.Repeat("b", guard.MaxKeyLen) {
		t.Errorf("second page, after the first page's key: %v, %v", next, err)
	}
	if page, err := all.List(ctx, first[0].Key[:len(first[0].Key)-1], "", 10); err != nil || len(page) != 1 {
		t.Errorf("List(prefix of a listed key): %v, %v; want that key", page, err)
	}
}

// A prefix or an after may end partway through a rune: "caf\xc3" starts
// "café", and List answers with the keys it starts, in byte order, page
// after page (every backend: cmd/warden's
// TestListPartwayThroughARuneOnEveryBackend).
func TestListPartwayThroughARune(t *testing.T) {
	ctx := context.Background()
	keys := []string{"cafe", "caf\u00bf", "caf\u00bfz", "café", "cafée", "caf\u00ff", "caf\u0100", "caf\u4e00", "caf\U0001f600"}
	g := newGuard(t, memory.New())
	for _, k := range keys {
		l, err := g.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
	}
	for _, c := range []struct {
		prefix, after string
		want          []string
	}{
		{"caf\xc3", "", []string{"café", "cafée", "caf\u00ff"}},
		{"caf\xc3", "café", []string{"cafée", "caf\u00ff"}},
		{"caf\xc3", "caf\xc3\xa9", []string{"cafée", "caf\u00ff"}},
		{"caf\xe4", "", []string{"caf\u4e00"}},
		{"caf\xf0\x9f", "", []string{"caf\U0001f600"}},
		{"caf", "caf\xc3", []string{"café", "cafée", "caf\u00ff", "caf\u0100", "caf\u4e00", "caf\U0001f600"}},
		{"caf", "caf\xc4", []string{"caf\u0100", "caf\u4e00", "caf\U0001f600"}},
	} {
		var got []string
		after := c.after
		for range len(keys) + 1 {
			page, err := g.List(ctx, c.prefix, after, 1)
			if err != nil {
				t.Fatalf("List(%q, %q): %v", c.prefix, after, err)
			}
			if len(page) == 0 {
				break
			}
			got = append(got, page[0].Key)
			after = page[0].Key
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("List(%q) after %q, a key a page: %q, want %q", c.prefix, c.after, got, c.want)
		}
	}
}

// The WARN of a forced release names every holding it removed, in a log
// whose records a JSON reader can take in: one key per attribute, not
// "owner" and "token" once per holder, of which a reader keeps only the
// last; and in a text log, where an owner label may hold spaces, as
// plainly.
func TestForceReleaseLogsEveryRemovedHolder(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	var logged, text bytes.Buffer
	both := slog.NewMultiHandler(slog.NewJSONHandler(&logged, nil), slog.NewTextHandler(&text, nil))
	g := newGuard(t, mem, guard.WithOwner("reader 1"), guard.WithLogger(slog.New(both)))
	other := newGuard(t, mem, guard.WithOwner("reader 2 x"))
	var tokens []uint64
	for _, g := range []*guard.Guard{g, other} {
		l, err := g.Lock(ctx, "doc", guard.Read())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
		tokens = append(tokens, l.Token())
	}
	logged.Reset()
	removed, err := g.ForceRelease(ctx, "doc", guard.ReleaseTarget{AnyHolder: true})
	if err != nil || len(removed) != 2 {
		t.Fatalf("removed %+v, %v; want both readers", removed, err)
	}
	var rec struct {
		Removed int
		Owners  []string
		Tokens  []uint64
	}
	if err := json.Unmarshal(logged.Bytes(), &rec); err != nil {
		t.Fatalf("%v in %s", err, logged.String())
	}
	slices.Sort(rec.Owners)
	slices.Sort(rec.Tokens)
	slices.Sort(tokens)
	want := []string{"reader 1", "reader 2 x"}
	if rec.Removed != 2 || !slices.Equal(rec.Owners, want) || !slices.Equal(rec.Tokens, tokens) {
		t.Errorf("the record, as a JSON reader takes it in: %+v; want removed 2, owners %q, tokens %v (logged %s)",
			rec, want, tokens, logged.String())
	}
	// The text record's owners: a quoted JSON array.
	_, value, _ := strings.Cut(text.String(), " owners=")
	var owners []string
	quoted, err := strconv.QuotedPrefix(value)
	if err == nil {
		value, _ = strconv.Unquote(quoted)
		err = json.Unmarshal([]byte(value), &owners)
	}
	slices.Sort(owners)
	if err != nil || !slices.Equal(owners, want) {
		t.Errorf("owners in the text record %q: %q (%v), want %q", text.String(), owners, err, want)
	}
}

func TestListAndForceRelease(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	g := newGuard(t, mem, guard.WithOwner("ops-test"), guard.WithTTL(time.Second))
	other := newGuard(t, mem, guard.WithPrefix("other:"))
	var locks []*guard.Lock
	for _, k := range []string{"jobs/b", "jobs/a", "mail/x"} {
		l, err := g.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	if _, err := other.Lock(ctx, "jobs/c"); err != nil { // another namespace: never listed
		t.Fatal(err)
	}
	page, err := g.List(ctx, "jobs/", "", 1)
	if err != nil || len(page) != 1 || page[0].Key != "jobs/a" || page[0].Holders[0].Owner != "ops-test" {
		t.Fatalf("first page %+v, %v; want jobs/a held by ops-test", page, err)
	}
	page, err = g.List(ctx, "jobs/", "jobs/a", 10)
	if err != nil || len(page) != 1 || page[0].Key != "jobs/b" {
		t.Fatalf("second page %+v, %v; want only jobs/b", page, err)
	}
	if _, err := g.List(ctx, "", "", 0); !errors.Is(err, guard.ErrInvalidOption) {
		t.Fatalf("List with limit 0: %v, want ErrInvalidOption", err)
	}

	// An operator saw jobs/a's holder, which then left; a new holder came.
	seen := locks[1]
	seen.Unlock(ctx)
	successor, err := g.Lock(ctx, "jobs/a")
	if err != nil {
		t.Fatal(err)
	}
	defer successor.Unlock(ctx)
	removed, err := g.ForceRelease(ctx, "jobs/a", guard.ReleaseTarget{Token: seen.Token(), Owner: "ops-test"})
	want := fmt.Sprintf(`warden: lock "jobs/a": the lock changed hands: now held by "ops-test" with token %d`, successor.Token())
	if !errors.Is(err, guard.ErrHolderChanged) || len(removed) != 0 || err.Error() != want {
		t.Fatalf("ForceRelease of a holder gone = %+v, %v; want ErrHolderChanged, %q", removed, err, want)
	}
	if successor.Err() != nil {
		t.Fatalf("the new holder after a refused release: %v, want its lock kept", successor.Err())
	}
	if _, err := g.ForceRelease(ctx, "jobs/a", guard.ReleaseTarget{}); !errors.Is(err, guard.ErrInvalidOption) {
		t.Fatalf("ForceRelease naming no holding: %v, want ErrInvalidOption", err)
	}

	victim := locks[0] // jobs/b
	removed, err = g.ForceRelease(ctx, "jobs/b", guard.ReleaseTarget{Token: victim.Token(), Owner: "ops-test"})
	if err != nil || len(removed) != 1 || removed[0].Token != victim.Token() {
		t.Fatalf("ForceRelease = %+v, %v; want the holder with token %d", removed, err, victim.Token())
	}
	select {
	case <-victim.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the holder's context was not cancelled after its lock was taken away")
	}
	if !errors.Is(victim.Err(), guard.ErrLockLost) {
		t.Fatalf("the old holder's Err after a forced release: %v, want ErrLockLost", victim.Err())
	}
	next, err := g.TryLock(ctx, "jobs/b")
	if err != nil || next.Token() <= victim.Token() {
		t.Fatalf("TryLock after the forced release: %v (token %v after %d)", err, next, victim.Token())
	}
	next.Unlock(ctx)
	if removed, err := g.ForceRelease(ctx, "jobs/b", guard.ReleaseTarget{AnyHolder: true}); err != nil || len(removed) != 0 {
		t.Fatalf("ForceRelease of a free lock: %+v, %v", removed, err)
	}
	if _, err := newGuard(t, withoutInspect{memory.New()}).ForceRelease(ctx, "k", guard.ReleaseTarget{AnyHolder: true}); !errors.Is(err, guard.ErrUnsupported) {
		t.Fatalf("ForceRelease on a backend without it: %v, want ErrUnsupported", err)
	}
	if _, err := newGuard(t, withoutInspect{memory.New()}).List(ctx, "", "", 10); !errors.Is(err, guard.ErrUnsupported) {
		t.Fatalf("List on a backend without it: %v, want ErrUnsupported", err)
	}
}

func TestPing(t *testing.T) {
	if err := newGuard(t, memory.New()).Ping(context.Background()); err != nil {
		t.Fatalf("Ping on memory: %v", err)
	}
	if err := newGuard(t, withoutInspect{memory.New()}).Ping(context.Background()); !errors.Is(err, guard.ErrUnsupported) {
		t.Fatalf("Ping on a backend without it: %v, want ErrUnsupported", err)
	}
}

// withoutInspect shows only the memory backend's Locker methods.
type withoutInspect struct{ driver.Locker }

// TestListShowsUnreadableLocks: a lock the backend lists as unreadable is
// in the Guard's page under its key without the prefix, with an Err that
// names the key and matches the backend's error, and the page's other
// locks are listed as they are.
func TestListShowsUnreadableLocks(t *testing.T) {
	ctx := context.Background()
	denied := fmt.Errorf("%w: refused by the ACL", driver.ErrUnavailable)
	mem := memory.New()
	g := newGuard(t, unreadable{Locker: mem, key: "warden:b", err: denied})
	for _, k := range []string{"a", "b", "c"} {
		l, err := g.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
	}
	page, err := g.List(ctx, "", "", 10)
	if err != nil || len(page) != 3 {
		t.Fatalf("List: %+v, %v; want three locks", page, err)
	}
	for _, in := range page {
		switch {
		case in.Key == "b" && (!errors.Is(in.Err, denied) || !strings.Contains(fmt.Sprint(in.Err), `lock "b"`) || len(in.Holders) != 0):
			t.Errorf("unreadable lock: %+v, want no holders and an Err naming it that matches the backend's", in)
		case in.Key != "b" && (in.Err != nil || len(in.Holders) != 1):
			t.Errorf("lock %q: %+v, want its holder and no Err", in.Key, in)
		}
	}
}

// unreadable is the memory backend with one lock listed as a backend lists
// one it may not read.
type unreadable struct {
	*memory.Locker
	key string
	err error
}

func (u unreadable) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	page, err := u.Locker.List(ctx, prefix, after, limit)
	for i := range page {
		if page[i].Key == u.key {
			page[i] = driver.Listed{Key: u.key, Err: u.err}
		}
	}
	return page, err
}

// TestListPassesAPartialPage: a backend's page that comes with
// driver.ErrPartialList (the backend left out locks it may not read, and
// said only that) reaches the caller with it, under the Guard's keys; a
// page that comes with any other error does not.
func TestListPassesAPartialPage(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	for _, c := range []struct {
		err     error
		partial bool
	}{
		{fmt.Errorf("%w: some keys were filtered", driver.ErrPartialList), true},
		{fmt.Errorf("%w: the server went away", driver.ErrUnavailable), false},
	} {
		g := newGuard(t, failingList{Locker: mem, err: c.err})
		l, err := g.Lock(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		page, err := g.List(ctx, "", "", 10)
		l.Unlock(ctx)
		switch {
		case !errors.Is(err, c.err):
			t.Errorf("List with the backend's %v: %v, want an error that matches it", c.err, err)
		case c.partial && (!errors.Is(err, guard.ErrPartialList) || len(page) != 1 || page[0].Key != "a" || len(page[0].Holders) != 1):
			t.Errorf("partial List: %+v, %v; want the lock \"a\" held, and ErrPartialList", page, err)
		case !c.partial && page != nil:
			t.Errorf("failed List: %+v, %v; want no page", page, err)
		}
	}
}

// failingList is the memory backend whose List pages come with err.
type failingList struct {
	*memory.Locker
	err error
}

func (f failingList) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	page, err := f.Locker.List(ctx, prefix, after, limit)
	if err != nil {
		return nil, err
	}
	return page, f.err
}

// A lease kept by a backend session has no renewals of its own: its JSON
// leaves "renewed" out rather than show the zero time.
func TestHeldJSONOfASessionLease(t *testing.T) {
	b, err := json.Marshal(guard.HeldLock{Key: "k", SessionBound: true})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "renewed") {
		t.Errorf("a session-bound lock's JSON %s has a renewal time", b)
	}
	b, err = json.Marshal(guard.HeldLock{Key: "k", Renewed: time.Unix(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"renewed"`) {
		t.Errorf("a renewed lock's JSON %s has no renewal time", b)
	}
}

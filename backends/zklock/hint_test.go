package zklock

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// TestHintPredecessor: the hints name the node a create queued behind only
// when that create is the only one since the listing, of the same parent
// node, and never from a listing whose newest node is the lister's own.
func TestHintPredecessor(t *testing.T) {
	const parent = "/locks/k"
	q := queue(nil, []string{
		guidPrefix + "00000000000000000000000000000001-write-0000000007",
		guidPrefix + "00000000000000000000000000000002-write-0000000009",
	})
	tail := q[1].name
	listed := &zk.Stat{Czxid: 5, Cversion: 10, NumChildren: 2}
	for _, tc := range []struct {
		name string
		st   *zk.Stat // the parent's after the create
		want string
	}{
		{"only its create", &zk.Stat{Czxid: 5, Cversion: 11, NumChildren: 3}, tail},
		{"its create and two deletes", &zk.Stat{Czxid: 5, Cversion: 13, NumChildren: 1}, tail},
		{"another create too", &zk.Stat{Czxid: 5, Cversion: 12, NumChildren: 4}, ""},
		{"another create and a delete", &zk.Stat{Czxid: 5, Cversion: 13, NumChildren: 3}, ""},
		{"a parent made again", &zk.Stat{Czxid: 6, Cversion: 1, NumChildren: 1}, ""},
		{"older than the listing", &zk.Stat{Czxid: 5, Cversion: 9, NumChildren: 2}, ""},
		{"no stat", nil, ""},
	} {
		var h hints
		h.note(parent, listed, q, "somebody else", "")
		if got := h.predecessor(parent, tc.st, 12); got != tc.want {
			t.Errorf("%s: predecessor %q, want %q", tc.name, got, tc.want)
		}
		if got := h.predecessor(parent+"x", tc.st, 12); got != "" {
			t.Errorf("%s: predecessor %q for a parent never listed", tc.name, got)
		}
	}

	var h hints
	h.note(parent, listed, q, tail, "")
	if got := h.predecessor(parent, &zk.Stat{Czxid: 5, Cversion: 11, NumChildren: 3}, 12); got != "" {
		t.Errorf("a listing whose newest node is the lister's own names %q", got)
	}
	h.note(parent, listed, q, "", "")
	h.note(parent, &zk.Stat{Czxid: 5, Cversion: 8, NumChildren: 1}, q[:1], "", "")
	if got := h.predecessor(parent, &zk.Stat{Czxid: 5, Cversion: 11, NumChildren: 3}, 12); got != tail {
		t.Errorf("an older listing answered later replaced the newer one: %q", got)
	}
}

// TestHintGuessesRequeue: when the one other create since the listing is
// not in it, the hints name the next node of the contender whose deletion
// woke the lister, numbered just before the new node; they name nothing
// when the lister was not woken by a deletion, or more creates came.
func TestHintGuessesRequeue(t *testing.T) {
	const parent = "/locks/k"
	q := queue(nil, []string{guidPrefix + "00000000000000000000000200000005-write-0000000009"})
	listed := &zk.Stat{Czxid: 5, Cversion: 20, NumChildren: 1}
	woke := guidPrefix + "00000000000000000000000a0000ffff-write-0000000008"
	next := guidPrefix + "00000000000000000000000a00010000-write-0000000011"
	for _, tc := range []struct {
		name string
		woke string
		st   *zk.Stat
		want string
	}{
		{"the woken one queued again", woke, &zk.Stat{Czxid: 5, Cversion: 22, NumChildren: 3}, next},
		{"and the lister's release", woke, &zk.Stat{Czxid: 5, Cversion: 23, NumChildren: 2}, next},
		{"not woken by a deletion", "", &zk.Stat{Czxid: 5, Cversion: 22, NumChildren: 3}, ""},
		{"two other creates", woke, &zk.Stat{Czxid: 5, Cversion: 23, NumChildren: 4}, ""},
		{"woken by no contender's node", "lock", &zk.Stat{Czxid: 5, Cversion: 22, NumChildren: 3}, ""},
	} {
		var h hints
		h.note(parent, listed, q, "somebody else", tc.woke)
		if got := h.predecessor(parent, tc.st, 12); got != tc.want {
			t.Errorf("%s: predecessor %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestGUIDsCountPerParent: a Locker's GUIDs share its seed and count the
// creates under the parents of one slot, so each is new under its parent.
func TestGUIDsCountPerParent(t *testing.T) {
	var h hints
	copy(h.seed[:], "twelve bytes")
	a1, a2, b1 := h.guid("/locks/a"), h.guid("/locks/a"), h.guid("/locks/b")
	seed := hex.EncodeToString(h.seed[:])
	for _, g := range [][32]byte{a1, a2, b1} {
		if !strings.HasPrefix(string(g[:]), seed) {
			t.Errorf("GUID %s does not start with the seed %s", g, seed)
		}
	}
	if a1 == a2 {
		t.Errorf("two creates under one parent got GUID %s", a1)
	}
	name := guidPrefix + string(a1[:]) + "-write-0000000004"
	if want := guidPrefix + string(a2[:]) + "-write-0000000007"; successor(name, 7) != want {
		t.Errorf("successor(%s) = %q, want %q", name, successor(name, 7), want)
	}
	if slotOf("/locks/a") != slotOf("/locks/b") && string(b1[24:]) != "00000001" {
		t.Errorf("the first create under another slot counts %s", b1[24:])
	}
}

// TestHintNamesRequeue: a Locker that held after a listing which the
// previous holder's new node missed (it queued again while the listing was
// on its way) queues behind that node without a listing when it comes
// back: create and watch. (Its grant is not counted: a lease granted from
// a listing sets its watch a few milliseconds later, a request more.)
func TestHintNamesRequeue(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, x, l, w, admin := dial(t, srv), dial(t, srv), dial(t, srv), dial(t, srv), dial(t, srv)
	k := testKey(t)
	held, err := p.Acquire(ctx, k, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	// x, l and w queue in turn: l has two ahead, so it lists once woken.
	got := map[*Locker]<-chan driver.Lease{}
	for i, c := range []*Locker{x, l, w} {
		got[c] = acquireLater(ctx, t, c, k)
		eventually(t, "the next waiter queues", func() bool { return waiters(t, admin, k) == i+1 })
	}
	next := func(c *Locker) {
		t.Helper()
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if held = <-got[c]; held == nil {
			t.FailNow()
		}
	}
	next(x)
	next(l) // l lists l's and w's nodes
	got[x] = acquireLater(ctx, t, x, k)
	eventually(t, "x queues again", func() bool { return waiters(t, admin, k) == 2 })
	next(w)
	before := l.requests.Load()
	got[l] = acquireLater(ctx, t, l, k)
	names, _, err := admin.conn.Children(l.lockPath(k))
	if err != nil {
		t.Fatal(err)
	}
	xNode := l.lockPath(k) + "/" + queue(nil, names)[1].name
	eventually(t, "l watches x's new node", func() bool {
		return l.requests.Load()-before == 2 && watches(t, srv[0], l.conn.SessionID(), xNode)
	})
	next(x)
	next(l)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHintSkipsListing: a waiter whose Locker listed the queue before, with
// nobody else queued since, watches the node it queues behind without a
// listing of its own; queued behind that one node, it then holds after
// three requests (create, watch, read of its own node), where a waiter
// without the hint sends four. A hint that names a node gone since (a
// waiter that gave up) costs the watch's read, and the waiter lists as
// usual: five.
func TestHintSkipsListing(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, l, quitter, admin := dial(t, srv), dial(t, srv), dial(t, srv), dial(t, srv)
	opts := driver.AcquireOptions{TTL: testSession}
	for _, tc := range []struct {
		name   string
		gone   bool  // the hint names a waiter that gives up before l queues
		queued int64 // requests sent until the waiter waits
		want   int64
	}{
		{"hint", false, 2, 3},
		{"hint of a node gone", true, 4, 5},
	} {
		k := testKey(t)
		parent := l.lockPath(k)
		blocker, err := holder.Acquire(ctx, k, opts)
		if err != nil {
			t.Fatal(err)
		}
		giveUp := func() {}
		if tc.gone {
			giveUp = queueQuitter(ctx, t, quitter, admin, k)
		}
		noteQueue(t, l, parent)
		if tc.gone {
			giveUp()
			eventually(t, "the quitter's node goes", func() bool { return waiters(t, admin, k) == 0 })
		}
		before := l.requests.Load()
		got := acquireLater(ctx, t, l, k)
		eventually(t, "the waiter watches the holder's node", func() bool {
			return l.requests.Load()-before == tc.queued && watches(t, srv[0], l.conn.SessionID(), blocker.(*lease).node)
		})
		if err := blocker.Release(ctx); err != nil {
			t.Fatal(err)
		}
		held := <-got
		if held == nil {
			t.FailNow()
		}
		_, stat, err := admin.conn.Get(held.(*lease).node)
		if err != nil {
			t.Fatal(err)
		}
		if held.Token() != uint64(stat.Czxid) || held.(*lease).ep.session != l.conn.SessionID() {
			t.Errorf("%s: token %d, session %d; want the node's czxid %d and %d", tc.name, held.Token(), held.(*lease).ep.session, stat.Czxid, l.conn.SessionID())
		}
		if n := l.requests.Load() - before; n != tc.want {
			t.Errorf("%s: the waiter sent %d requests, want %d", tc.name, n, tc.want)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// watches reports whether session sid has a watch on path on the ZooKeeper
// server at addr, by its wchc command: each session's id in hex, then the
// paths it watches, one a line after a tab.
func watches(t testing.TB, addr string, sid int64, path string) bool {
	mine := false
	for line := range strings.Lines(fourLetter(t, addr, "wchc")) {
		line = strings.TrimRight(line, "\n")
		if p, ok := strings.CutPrefix(line, "\t"); ok {
			if mine && p == path {
				return true
			}
			continue
		}
		mine = line == fmt.Sprintf("0x%x", sid)
	}
	return false
}

// queueQuitter has quitter wait for key k, which another holds, until
// the returned giveUp, which waits for it to have given up.
func queueQuitter(ctx context.Context, t *testing.T, quitter *Locker, admin *Locker, k string) (giveUp func()) {
	t.Helper()
	qctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := quitter.Acquire(qctx, k, driver.AcquireOptions{TTL: testSession, Wait: true})
		gaveUp <- err
	}()
	eventually(t, "the quitter queues", func() bool { return waiters(t, admin, k) == 1 })
	return func() {
		t.Helper()
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Fatalf("the quitter's Acquire: %v, want context.Canceled", err)
		}
	}
}

// noteQueue lists parent's queue for l's hints, and returns the names.
func noteQueue(t *testing.T, l *Locker, parent string) []string {
	t.Helper()
	names, st, err := l.conn.Children(parent)
	if err != nil {
		t.Fatal(err)
	}
	l.hints.note(parent, st, queue(nil, names), "", "")
	return names
}

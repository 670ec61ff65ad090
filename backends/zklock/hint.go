package zklock

import (
	"sync"

	"github.com/go-zookeeper/zk"
)

// A waiter's first listing of the queue only tells it which node to watch:
// the one created last before its own. The Locker often knows that node
// already, from its latest listing of the same queue (a holder lists it at
// its grant, and queues again at the tail once it releases), and it can
// tell whether anyone else joined since: the parent's stat counts the
// changes of its children (cversion, one per create and one per delete) and
// its children, so creates since = (Δcversion + Δchildren) / 2, and the
// create's multi returns that stat right after the new node was made. When
// the only create since the listing is its own, the newest node of that
// listing that still exists is the one it queues behind; the watch's read
// tells whether it does. The waiter then sends three requests before it
// holds, not four: the create, the watch and, once woken, a listing (or the
// read of its own node when that one node was the only one ahead). Whether
// it holds is still judged only from a listing, or from the deletion of the
// only node ahead, as without the hint; a hint that is wrong costs the
// watch's read of a node gone, after which it lists as usual.

// hintSlots is how many lock parents' latest listings a Locker keeps: a
// parent's slot is picked by a hash of its path, and a parent listed later
// takes the slot over.
const hintSlots = 32

// hints is the Locker's latest listings of lock queues.
type hints struct {
	mu    sync.Mutex
	slots [hintSlots]hint
}

// hint is what one listing of a lock's queue saw.
type hint struct {
	parent   string
	czxid    int64 // the parent's: a parent removed and made again is another node
	cversion int32
	children int32
	tail     string // the name of the newest contender listed
}

// slot is where parent's hint lives (FNV-1a of its path).
func (h *hints) slot(parent string) *hint {
	x := uint32(2166136261)
	for i := 0; i < len(parent); i++ {
		x ^= uint32(parent[i])
		x *= 16777619
	}
	return &h.slots[x%hintSlots]
}

// note records a listing of parent, whose stat is st and ordered queue q,
// made by the contender named self. A listing whose newest contender is
// self is not kept: self's node goes once it is released.
func (h *hints) note(parent string, st *zk.Stat, q []contender, self string) {
	if st == nil || len(q) == 0 || q[len(q)-1].name == self {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.slot(parent)
	if s.parent == parent && st.Cversion-s.cversion < 0 && st.Czxid == s.czxid {
		// An older listing answered after a newer one.
		return
	}
	*s = hint{parent: parent, czxid: st.Czxid, cversion: st.Cversion, children: st.NumChildren, tail: q[len(q)-1].name}
}

// predecessor returns the name of the node that the contender whose create
// left parent with stat st queues behind, if that node still exists, when
// the latest listing of parent shows it (see above); "" when it cannot
// tell.
func (h *hints) predecessor(parent string, st *zk.Stat) string {
	if st == nil {
		return ""
	}
	h.mu.Lock()
	s := *h.slot(parent)
	h.mu.Unlock()
	if s.parent != parent || s.czxid != st.Czxid {
		return ""
	}
	changes, grown := int64(st.Cversion)-int64(s.cversion), int64(st.NumChildren)-int64(s.children)
	if changes+grown != 2 || grown > changes {
		// Not exactly one create since the listing (its own).
		return ""
	}
	return s.tail
}

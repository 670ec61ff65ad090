package zklock

import (
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
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
//
// Often one other create came between: that of the contender whose release
// woke the lister, which queued again at once while the lister's listing
// was on its way (the two race, and the listing wins about two times in
// three). That contender's node is named from its Locker's GUIDs, whose
// last 8 hex digits count the Locker's creates under the parent's slot
// (see guid), so its next node is named like its last one with the count
// one higher, the same kind, and the sequence number before the waiter's
// own (the server numbers the creates under a parent, one by one). The
// waiter watches that node, if it exists: it queues ahead of the waiter,
// and, as before, a guess that names no node costs a read, after which
// the waiter lists.

// hintSlots is how many lock parents' latest listings a Locker keeps: a
// parent's slot is picked by a hash of its path, and a parent listed later
// takes the slot over.
const hintSlots = 32

// hints is the Locker's latest listings of lock queues, and the counts of
// its contender nodes' GUIDs.
type hints struct {
	seed  [12]byte // random, drawn once per Locker: the first 24 hex digits of its GUIDs
	mu    sync.Mutex
	slots [hintSlots]hint
	count [hintSlots]uint32 // creates under the parents of each slot
}

// hint is what one listing of a lock's queue saw.
type hint struct {
	parent   string
	czxid    int64 // the parent's: a parent removed and made again is another node
	cversion int32
	children int32
	tail     string // the name of the newest contender listed
	woke     string // the node whose deletion woke the lister, if it was woken so
}

// slotOf is the slot of parent (FNV-1a of its path).
func slotOf(parent string) int {
	x := uint32(2166136261)
	for i := 0; i < len(parent); i++ {
		x ^= uint32(parent[i])
		x *= 16777619
	}
	return int(x % hintSlots)
}

// slot is where parent's hint lives.
func (h *hints) slot(parent string) *hint { return &h.slots[slotOf(parent)] }

// guid returns the GUID of a new contender node under parent, as 32 hex
// digits: the seed, then the count of the creates under the parents of
// parent's slot. It is unique among the Locker's nodes under parent, and
// other Lockers' GUIDs start with other seeds; the count lets a Locker
// name the next node of a contender queued ahead of it (see successor).
func (h *hints) guid(parent string) [32]byte {
	var g [16]byte
	copy(g[:], h.seed[:])
	i := slotOf(parent)
	h.mu.Lock()
	h.count[i]++
	binary.BigEndian.PutUint32(g[12:], h.count[i])
	h.mu.Unlock()
	var x [32]byte
	hex.Encode(x[:], g[:])
	return x
}

// note records a listing of parent, whose stat is st and ordered queue q,
// made by the contender named self, woken by the deletion of the node
// named woke ("" if it was not). A listing whose newest contender is self
// is not kept: self's node goes once it is released.
func (h *hints) note(parent string, st *zk.Stat, q []contender, self, woke string) {
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
	*s = hint{parent: parent, czxid: st.Czxid, cversion: st.Cversion, children: st.NumChildren, tail: q[len(q)-1].name, woke: woke}
}

// predecessor returns the name of the node that the contender whose create
// left parent with stat st, and whose sequence number is seq, queues
// behind, or of a node ahead of it, if that node still exists, when the
// latest listing of parent shows it or the node woken upon names it (see
// above); "" when it cannot tell.
func (h *hints) predecessor(parent string, st *zk.Stat, seq int64) string {
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
	if grown > changes {
		return ""
	}
	switch changes + grown { // twice the creates since the listing
	case 2:
		// Its own alone.
		return s.tail
	case 4:
		// Its own and one other: the woken node's contender queuing
		// again, if it did so first.
		return successor(s.woke, seq-1)
	}
	return ""
}

// successor names the next node under the same parent of the contender
// whose node was named name, if its sequence number is seq: its GUID's
// count one higher (see guid); "" when name is no contender's.
func successor(name string, seq int64) string {
	rest, ok := strings.CutPrefix(name, guidPrefix)
	if !ok || len(rest) < 34 || rest[32] != '-' || seq < 0 {
		return ""
	}
	n, err := strconv.ParseUint(rest[24:32], 16, 32)
	i := strings.LastIndexByte(rest, '-')
	if err != nil || i < 33 {
		return ""
	}
	var c [4]byte
	binary.BigEndian.PutUint32(c[:], uint32(n)+1)
	var x [8]byte
	hex.Encode(x[:], c[:])
	digits := strconv.FormatInt(seq, 10)
	var b strings.Builder
	b.Grow(len(guidPrefix) + i + 1 + 10)
	b.WriteString(guidPrefix)
	b.WriteString(rest[:24])
	b.Write(x[:])
	b.WriteString(rest[32 : i+1])
	for range 10 - len(digits) {
		b.WriteByte('0')
	}
	b.WriteString(digits)
	return b.String()
}

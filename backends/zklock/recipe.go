package zklock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// kind is what a contender node asks for; it is part of the node's name so
// that every contender can judge the whole queue from one listing.
type kind string

const (
	kindWrite  kind = "write" // exclusive: Acquire and AcquireWrite
	kindRead   kind = "read"
	kindPermit kind = "permit" // one of a semaphore's permits
)

// guidPrefix starts every contender node name; the 32 hex digits after it
// identify one create, so a retried create can find its own node (see
// hints.guid).
const guidPrefix = "_c_"

// errRequeue says the contender's node vanished (its session expired while
// it waited): queue again with a new node.
var errRequeue = errors.New("zookeeper: contender node vanished")

// Acquire takes the exclusive lock on key: it is a write lock in the
// read/write recipe, so it excludes AcquireRead and AcquireWrite on the same
// key too. The lease lives with the Locker's session (opts.TTL is not used),
// and waiters are served first come, first served whatever opts.Fair says.
func (l *Locker) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, kindWrite, 0, opts)
}

// AcquireWrite takes key for writing: no other writer and no reader holds it
// at the same time. It is the same lock as Acquire.
func (l *Locker) AcquireWrite(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, kindWrite, 0, opts)
}

// AcquireRead takes key for reading, alongside other readers. A reader waits
// for the last writer queued before it, so a waiting writer is not starved by
// readers that come after it.
func (l *Locker) AcquireRead(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	return l.acquire(ctx, key, kindRead, 0, opts)
}

// AcquireSemaphore takes one of permits permits on key, in arrival order.
// Every contender of a key must pass the same permits. Semaphores live apart
// from the locks: key as a semaphore and key as a lock do not exclude each
// other.
func (l *Locker) AcquireSemaphore(ctx context.Context, key string, permits int, opts driver.AcquireOptions) (driver.Lease, error) {
	if permits < 1 {
		return nil, fmt.Errorf("%w: %d permits", driver.ErrInvalidOption, permits)
	}
	return l.acquire(ctx, key, kindPermit, permits, opts)
}

func (l *Locker) acquire(ctx context.Context, key string, k kind, permits int, opts driver.AcquireOptions) (driver.Lease, error) {
	parent := l.lockPath(key)
	if k == kindPermit {
		parent = l.semaphorePath(key)
	}
	backoff := driver.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	for {
		l.mu.Lock()
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return nil, errClosed
		}
		c, err := l.enqueue(ctx, parent, k, []byte(opts.Owner))
		var lease driver.Lease
		if err == nil {
			// Checked once the create has been answered, which tells the
			// session timeout the server granted.
			if err = l.checkTTL(opts.TTL); err != nil {
				return nil, l.leave(ctx, c.node, err)
			}
			lease, err = l.contend(ctx, parent, c, k, permits, opts.Wait)
		}
		switch {
		case errors.Is(err, errRequeue):
			continue
		case opts.Wait && errors.Is(err, driver.ErrUnavailable) && !errors.Is(err, errDenied):
			// A waiting Acquire goes on through an unreachable ensemble
			// until its context ends; a refusal by the ACL would only
			// come again.
			if err := driver.Sleep(ctx, backoff.Next(), nil); err != nil {
				return nil, err
			}
			continue
		}
		return lease, err
	}
}

// lockPath is the parent node of key's lock and read/write lock.
func (l *Locker) lockPath(key string) string { return l.keyPath(key, "") }

// semaphorePath is the parent node of key's semaphore; '~' never survives
// escape, so it cannot collide with a lock's parent.
func (l *Locker) semaphorePath(key string) string { return l.keyPath(key, "~semaphore") }

// keyPath is the node under the root named by escaping key, with suffix:
// built in one allocation, since every acquisition makes one.
func (l *Locker) keyPath(key, suffix string) string {
	var b strings.Builder
	b.Grow(len(l.root) + 1 + len(key) + 8 + len(suffix))
	b.WriteString(l.root)
	b.WriteByte('/')
	escapeTo(&b, key)
	b.WriteString(suffix)
	return b.String()
}

// escape turns any key into one valid node name, readable where the key is:
// bytes outside [A-Za-z0-9_:.-] become %XX, and so does a leading '.' (the
// names "." and ".." are reserved).
func escape(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 8)
	escapeTo(&b, key)
	return b.String()
}

// escapeTo writes escape(key) to b.
func escapeTo(b *strings.Builder, key string) {
	for i := 0; i < len(key); i++ {
		c := key[i]
		safe := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '_' || c == '-' || c == ':' || c == '.' && i > 0
		if safe {
			b.WriteByte(c)
		} else {
			const hexDigits = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
}

// enqueue creates the contender node under parent. When ctx ends first, the
// create may still complete: a cleanup deletes whatever it made.
func (l *Locker) enqueue(ctx context.Context, parent string, k kind, data []byte) (created, error) {
	cr := &creation{l: l, parent: parent, data: data}
	cr.prefix, cr.guid = contenderPrefix(parent, k, l.hints.guid(parent))
	if err := l.send(ctx, "create", cr); err != nil {
		return created{}, err
	}
	if cr.err == nil {
		return cr.c, nil
	}
	if cr.maybe {
		l.sweepLater(parent, cr.guid)
	}
	return cr.c, l.failed(cr.err)
}

// contenderPrefix is the path, under parent, of a new contender node of
// kind k with GUID g (see hints.guid) up to the sequence number the server
// appends, and the GUID in it, a part of the same string.
func contenderPrefix(parent string, k kind, g [32]byte) (prefix, guid string) {
	var b strings.Builder
	b.Grow(len(parent) + 1 + len(guidPrefix) + len(g) + len(k) + 2)
	b.WriteString(parent)
	b.WriteByte('/')
	b.WriteString(guidPrefix)
	start := b.Len()
	b.Write(g[:])
	b.WriteByte('-')
	b.WriteString(string(k))
	b.WriteByte('-')
	prefix = b.String()
	return prefix, prefix[start : start+len(g)]
}

// creation is the request of enqueue, and its result.
type creation struct {
	l      *Locker
	parent string
	prefix string // see contenderPrefix
	guid   string
	data   []byte

	c     created
	maybe bool
	err   error
}

func (cr *creation) Run() {
	cr.c, cr.maybe, cr.err = cr.l.create(cr.parent, cr.prefix, cr.guid, cr.data)
}

func (cr *creation) Abandoned() {
	l := cr.l
	switch {
	case cr.err == nil:
		l.removeLater(cr.c.node, nil)
	case cr.maybe:
		l.sweepLater(cr.parent, cr.guid)
	}
}

// created is what the create of a contender node tells: its path, and,
// unless the answer was lost or the session changed meanwhile, its czxid
// (the fencing token), the session that owns it, the send time of the
// create, and whether the node was its parent's only child then. Without
// them the grant reads the node's stat.
type created struct {
	node  string
	czxid int64
	sid   int64
	sent  time.Time
	only  bool
	pstat *zk.Stat // the parent's right after the create (see hints)
}

// create is the protected create: after a connection loss, whether the node
// was made is unknown, so it looks for its GUID among parent's children
// before trying again. maybe reports that a node may exist even though an
// error is returned.
//
// The create is one multi-operation with an empty write of parent's data:
// ZooKeeper gives a multi one zxid, so the parent's mzxid in the write's
// answer is the new node's czxid, and the grant needs no read of the node;
// and the parent's number of children in that answer, counted right after
// the create, says whether the new node is alone in the queue, and so holds
// the lock without a listing.
func (l *Locker) create(parent, prefix, guid string, data []byte) (c created, maybe bool, err error) {
	for range 5 {
		l.requests.Add(1)
		sid, sent := l.conn.SessionID(), time.Now()
		if l.plainCreate.Load() {
			c.node, err = l.conn.Create(prefix, data, zk.FlagEphemeralSequential, l.acl)
		} else {
			c, err = l.createMulti(parent, prefix, data, sid, sent)
		}
		switch {
		case err == nil:
			l.ack(sent, sid)
			return c, maybe, nil
		case errors.Is(err, zk.ErrNoAuth) && !l.plainCreate.Load():
			// The ACL lets the Locker create nodes under parent but not
			// write parent's data: a multi fails as a whole, so nothing was
			// made; create alone from now on, and read the stat at grant.
			l.plainCreate.Store(true)
		case errors.Is(err, zk.ErrNoNode):
			if err := l.makeParent(parent); err != nil {
				return created{}, maybe, err
			}
		case errors.Is(err, zk.ErrConnectionClosed):
			maybe = true
			name, err := l.find(parent, guid)
			if err != nil {
				return created{}, maybe, err
			}
			if name != "" {
				return created{node: parent + "/" + name}, maybe, nil
			}
		case errors.Is(err, zk.ErrSessionExpired):
			// Whatever was made went with the session: just try again.
		default:
			return created{}, maybe, unavailable("create", err)
		}
	}
	return created{}, maybe, unavailable("create", err)
}

// createMulti creates the contender node prefix under parent in a
// multi-operation with an empty write of parent's data (see create), sent
// at sent in session sid.
func (l *Locker) createMulti(parent, prefix string, data []byte, sid int64, sent time.Time) (created, error) {
	res, err := l.conn.Multi(
		&zk.CreateRequest{Path: prefix, Data: data, Acl: l.acl, Flags: zk.FlagEphemeralSequential},
		&zk.SetDataRequest{Path: parent, Version: -1})
	if err != nil {
		return created{}, err
	}
	if len(res) != 2 {
		return created{}, fmt.Errorf("multi answered %d results for 2 operations", len(res))
	}
	c := created{node: res[0].String}
	if st := res[1].Stat; st != nil && sid != 0 && l.conn.SessionID() == sid {
		c.czxid, c.sid, c.sent, c.only, c.pstat = st.Mzxid, sid, sent, st.NumChildren == 1, st
	}
	return c, nil
}

// makeParent creates parent as a container node (the server deletes it once
// it is empty), creating the persistent root first if needed.
func (l *Locker) makeParent(parent string) error {
	for range 2 {
		l.requests.Add(1)
		_, err := l.conn.CreateContainer(parent, nil, zk.FlagContainer, l.acl)
		if err == nil || errors.Is(err, zk.ErrNodeExists) {
			return nil
		}
		if !errors.Is(err, zk.ErrNoNode) {
			return unavailable("create parent", err)
		}
		p := ""
		for _, part := range strings.Split(l.root[1:], "/") {
			p += "/" + part
			l.requests.Add(1)
			if _, err := l.conn.Create(p, nil, zk.FlagPersistent, l.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return unavailable("create root", err)
			}
		}
	}
	return nil
}

// find returns the name of parent's child made by the create with guid, or "".
func (l *Locker) find(parent, guid string) (string, error) {
	l.requests.Add(1)
	names, _, err := l.conn.Children(parent)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return "", unavailable("list", err)
	}
	for _, name := range names {
		if strings.HasPrefix(name, guidPrefix+guid) {
			return name, nil
		}
	}
	return "", nil
}

// sweep deletes any node a create with guid left under parent.
func (l *Locker) sweep(parent, guid string) error {
	name, err := l.find(parent, guid)
	if err != nil || name == "" {
		return err
	}
	return l.remove(parent + "/" + name)
}

// sweepLater sweeps in the background (see sweep and retry).
func (l *Locker) sweepLater(parent, guid string) {
	l.background(func() {
		l.retry("search of "+parent+" for the node of a create whose answer was lost", func() error { return l.sweep(parent, guid) })
	})
}

// remove deletes node; a node already gone, or gone with its expired
// session, needs nothing more.
func (l *Locker) remove(node string) error {
	l.requests.Add(1)
	err := l.conn.Delete(node, -1)
	if err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrSessionExpired) {
		return nil
	}
	return unavailable("delete", err)
}

// removeLater removes node in the background (see retry), and reports
// false, doing nothing, once the Locker is closed. answered, if not nil, is
// closed once a try deleted the node or the ACL refused it: waiting longer
// for a refused delete, retried slowly, would tell nothing more.
func (l *Locker) removeLater(node string, answered chan<- struct{}) bool {
	return l.background(func() {
		var once sync.Once
		answer := func() {
			if answered != nil {
				once.Do(func() { close(answered) })
			}
		}
		defer answer()
		l.retry("delete of "+node, func() error {
			err := l.remove(node)
			if err == nil || errors.Is(err, errDenied) {
				answer()
			}
			return err
		})
	})
}

// leave withdraws a contender that will not hold: its node must go, or the
// next contender would queue behind it forever. It waits for the delete's
// answer while ctx lasts, up to a session timeout (far longer than a healthy
// server needs), and leaves the delete to the background after, and returns
// cause. A contender that gives up because ctx ended thus returns at once.
func (l *Locker) leave(ctx context.Context, node string, cause error) error {
	answered := make(chan struct{})
	if !l.removeLater(node, answered) {
		return cause
	}
	timeout := time.NewTimer(l.sessionTimeout())
	defer timeout.Stop()
	select {
	case <-answered:
	case <-ctx.Done():
	case <-timeout.C:
	}
	return cause
}

// contender is one node of a lock's queue.
type contender struct {
	name string
	kind kind
	seq  int64
}

// sequence is the sequence number at the end of a contender node's name,
// or -1.
func sequence(name string) int64 {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return -1
	}
	seq, err := strconv.ParseInt(name[i+1:], 10, 64)
	if err != nil {
		return -1
	}
	return seq
}

// queue parses and orders the children of a lock's parent into q, whose
// contents it replaces; names that are not contender nodes are ignored.
func queue(q []contender, names []string) []contender {
	q = slices.Grow(q[:0], len(names))
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, guidPrefix)
		if !ok || len(rest) < 34 || rest[32] != '-' {
			continue
		}
		rest = rest[33:]
		i := strings.LastIndexByte(rest, '-')
		if i < 0 {
			continue
		}
		seq, err := strconv.ParseInt(rest[i+1:], 10, 64)
		if err != nil {
			continue
		}
		q = append(q, contender{name: name, kind: kind(rest[:i]), seq: seq})
	}
	slices.SortFunc(q, func(a, b contender) int { return cmp.Compare(a.seq, b.seq) })
	return q
}

// decide judges contender pos of q: whether it holds, and if not, the one
// node it must watch (target), or, for the first waiter of a semaphore, that
// it must watch the whole list (all).
func decide(q []contender, pos, permits int) (holds bool, target string, all bool) {
	switch q[pos].kind {
	case kindRead:
		for i := pos - 1; i >= 0; i-- {
			if q[i].kind != kindRead {
				return false, q[i].name, false
			}
		}
		return true, "", false
	case kindPermit:
		switch {
		case pos < permits:
			return true, "", false
		case pos == permits:
			// Any holder leaving frees a permit for this one, so it alone
			// watches the list; the waiters behind it watch their predecessor.
			return false, "", true
		}
		return false, q[pos-1].name, false
	default:
		if pos == 0 {
			return true, "", false
		}
		return false, q[pos-1].name, false
	}
}

// listing is a read of a lock's queue, and the session it was read in (0
// when the session changed while it was in flight).
type listing struct {
	names []string
	stat  *zk.Stat // the parent's
	ch    <-chan zk.Event
	sid   int64
}

type existence struct {
	ok   bool
	stat *zk.Stat
	ch   <-chan zk.Event
}

// contend waits, if wait, until c's node is a holder of parent's lock, and
// turns it into a lease; a contender that gives up deletes its node.
//
// A lock's grant costs no request of its own: the token is the node's
// czxid, which the create reported (see create); the owning session is the
// one that made the node, when the listing that finds it a holder was read
// in that same session (a node listed in its own session is that session's).
// A node its create found alone in the queue holds at once, without a
// listing. Either way, its revocation watch, a data watch on its node, is
// set watchDelay after the grant if the lease is still held then (a shorter
// section sends nothing more), and a deletion that comes first is found by
// that read. A waiter woken by the deletion of the only node ahead of it
// reads its own node instead of listing the queue again, which sets the
// watch at once. A writer whose Locker's hints name the node it queues
// behind watches that node before any listing (see hint.go). The listings
// set no watch: a child watch on the queue would fire on every
// contender's arrival and departure, a notification to each waiter's
// session for every change, and a data watch to set after all once it
// fired while the lease was held. A permit's grant writes its node
// instead (see grantPermit).
func (l *Locker) contend(ctx context.Context, parent string, c created, k kind, permits int, wait bool) (driver.Lease, error) {
	node := c.node
	name := node[len(parent)+1:]
	var le *lease
	if k != kindPermit {
		le = &lease{l: l, node: node}
		if c.only && c.czxid != 0 && c.sid != 0 {
			return l.granted(ctx, le, c.czxid, c.sid, c.sent)
		}
	}
	woke := "" // the node whose deletion woke the contender last (see hints.note)
	if k == kindWrite && wait {
		// Queued behind the node the hints name, if it is still there.
		if pred := l.hints.predecessor(parent, c.pstat, sequence(name)); pred != "" {
			e, err := l.watchNode(ctx, parent+"/"+pred)
			switch {
			case err == nil:
				ev, err := l.await(ctx, node, e.ch)
				if err != nil {
					return nil, err
				}
				if ev.Type == zk.EventNodeDeleted {
					// Two children after the create: that node was the
					// only one ahead (see the sole case below).
					if c.pstat.NumChildren == 2 {
						return l.grantRead(ctx, le)
					}
					woke = pred
				}
			case !errors.Is(err, zk.ErrNoNode):
				return nil, l.leave(ctx, node, err)
			}
		}
	}
	watchAll := false
	var q []contender // kept from one listing to the next
	for {
		sent := time.Now()
		withWatch := watchAll // a copy the listing captures without an allocation
		r, err := call(ctx, l, "list", func() (listing, error) {
			var lst listing
			var err error
			sid := l.conn.SessionID()
			if withWatch {
				lst.names, lst.stat, lst.ch, err = l.conn.ChildrenW(parent)
			} else {
				lst.names, lst.stat, err = l.conn.Children(parent)
			}
			if l.conn.SessionID() == sid {
				lst.sid = sid
			}
			return lst, err
		})
		holds, target, all, sole := false, "", false, false
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			q = queue(q, r.names)
			pos := slices.IndexFunc(q, func(c contender) bool { return c.name == name })
			if pos < 0 {
				return nil, errRequeue
			}
			holds, target, all = decide(q, pos, permits)
			sole = le != nil && blockers(q, pos) == 1
			if err == nil {
				l.hints.note(parent, r.stat, q, name, woke)
			}
		}
		switch {
		case err != nil && !errors.Is(err, zk.ErrNoNode):
			return nil, l.leave(ctx, node, err)
		case holds && le != nil:
			if c.czxid != 0 && c.sid != 0 && r.sid == c.sid {
				return l.granted(ctx, le, c.czxid, c.sid, sent)
			}
			return l.grantRead(ctx, le)
		case holds:
			return l.grantPermit(ctx, node)
		case !wait:
			return nil, l.leave(ctx, node, driver.ErrNotAcquired)
		case all && !watchAll:
			watchAll = true
			continue
		case all:
		default:
			e, err := l.watchNode(ctx, parent+"/"+target)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				// Gone since the listing: look again.
				continue
			case err != nil:
				return nil, l.leave(ctx, node, err)
			case k == kindPermit && e.stat.Version > 0:
				// A semaphore contender that took its permit marks its
				// node (see grant); the one behind it may then be first
				// in line.
				continue
			}
			r.ch = e.ch
		}
		ev, err := l.await(ctx, node, r.ch)
		if err != nil {
			return nil, err
		}
		// The only node ahead is gone, and none can come before: c's node
		// holds if it is still there, which the read that sets its
		// revocation watch tells instead of another listing.
		if sole && ev.Type == zk.EventNodeDeleted {
			return l.grantRead(ctx, le)
		}
		woke = ""
		if ev.Type == zk.EventNodeDeleted {
			woke = target
		}
	}
}

// await waits for the event of a watch the contender of node set, or, when
// ctx ends first, withdraws node and returns ctx's error.
func (l *Locker) await(ctx context.Context, node string, ch <-chan zk.Event) (zk.Event, error) {
	select {
	case ev := <-ch:
		return ev, nil
	case <-ctx.Done():
		return zk.Event{}, l.leave(ctx, node, ctx.Err())
	}
}

// watchNode sets a data watch on node, the one a contender queues behind,
// which fires when the node changes or goes. It reads the node's data for
// it rather than asking whether it exists: a node gone since the listing
// then fails with zk.ErrNoNode and leaves no watch, where an exists watch
// would stay registered for its creation, on the server and in the client
// library, until the session ends, and nobody creates a contender node
// twice.
func (l *Locker) watchNode(ctx context.Context, node string) (existence, error) {
	return call(ctx, l, "watch", func() (existence, error) {
		_, stat, ch, err := l.conn.GetW(node)
		return existence{ok: err == nil, stat: stat, ch: ch}, err
	})
}

// blockers counts the contenders of a lock's queue q that keep the one at
// pos from holding: every one before a writer, the writers before a reader.
// Contenders only join the queue behind the others (their sequence numbers
// grow), so once they are gone, it holds.
func blockers(q []contender, pos int) int {
	if q[pos].kind != kindRead {
		return pos
	}
	n := 0
	for _, c := range q[:pos] {
		if c.kind != kindRead {
			n++
		}
	}
	return n
}

// grantRead grants the lease le from a read of its node's stat, for a
// contender whose create did not tell its czxid and session (its answer was
// lost, or the session changed since), or that was woken by the deletion of
// the only node ahead of it: the read tells that its node is still there
// (an operator may have deleted it meanwhile, or the session expired), and
// sets the lease's revocation watch at once.
func (l *Locker) grantRead(ctx context.Context, le *lease) (driver.Lease, error) {
	l.track(le)
	sent := time.Now()
	e, err := call(ctx, l, "stat", func() (existence, error) {
		_, stat, _, err := l.conn.GetW(le.node)
		return existence{stat: stat}, err
	})
	switch {
	case errors.Is(err, zk.ErrNoNode):
		l.untrack(le)
		return nil, errRequeue
	case err != nil:
		l.untrack(le)
		return nil, l.leave(ctx, le.node, err)
	}
	return l.grantedTracked(ctx, le, e.stat.Czxid, e.stat.EphemeralOwner, sent)
}

// granted makes le, found a holder by a request sent at sent, a lease with
// token czxid on a node owned by session owner, and has its revocation
// watch set watchDelay later.
func (l *Locker) granted(ctx context.Context, le *lease, czxid, owner int64, sent time.Time) (driver.Lease, error) {
	l.track(le)
	lease, err := l.grantedTracked(ctx, le, czxid, owner, sent)
	if err == nil {
		l.watchAfter(le)
	}
	return lease, err
}

// grantedTracked is granted for a lease already tracked, whose watch is
// set otherwise.
func (l *Locker) grantedTracked(ctx context.Context, le *lease, czxid, owner int64, sent time.Time) (driver.Lease, error) {
	le.token = uint64(czxid)
	if err := l.grantEpoch(le, owner, sent); err != nil {
		l.untrack(le)
		return nil, l.leave(ctx, le.node, err)
	}
	return le, nil
}

// grantPermit takes a semaphore permit at its turn. It writes to the
// permit's node rather than reading it, since the change wakes the
// contender queued behind, which may now be first in line; the revocation
// watch, which the write would have fired, is set afterwards without
// waiting.
func (l *Locker) grantPermit(ctx context.Context, node string) (driver.Lease, error) {
	le := &lease{l: l, node: node}
	l.track(le)
	sent := time.Now()
	stat, err := call(ctx, l, "stat", func() (*zk.Stat, error) { return l.conn.Set(node, nil, -1) })
	switch {
	case errors.Is(err, zk.ErrNoNode):
		l.untrack(le)
		return nil, errRequeue
	case err != nil:
		l.untrack(le)
		return nil, l.leave(ctx, le.node, err)
	}
	lease, err := l.grantedTracked(ctx, le, stat.Czxid, stat.EphemeralOwner, sent)
	if err == nil {
		l.watchLater(le)
	}
	return lease, err
}

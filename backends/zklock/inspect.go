package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

var (
	_ driver.Inspector     = (*Locker)(nil)
	_ driver.Lister        = (*Locker)(nil)
	_ driver.ForceReleaser = (*Locker)(nil)
)

// holder is a contender node that holds its lock, as read from the server.
type holder struct {
	node    string
	version int32 // of the node's data, for a delete that checks it
	driver.Holding
}

// Inspect implements driver.Inspector for the lock and read/write lock of
// key (semaphores live apart, under their own parent, and are not
// reported). The holders are the contenders decide admits: the first node
// when it is a writer's, or else every reader queued before the first
// writer. Waiters counts the other contender nodes. Each holding is
// SessionBound, with TTL 0, since its node lives as long as its holder's
// session; its owner is the node's data, the label it was created with.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	hs, waiters, err := l.holders(ctx, l.lockPath(key))
	if err != nil {
		return driver.Inspection{}, err
	}
	return driver.Inspection{Holders: holdings(hs), Waiters: waiters}, nil
}

// holders lists parent's contenders and reads the holders' nodes. A holder
// that leaves between the listing and the read of its node may have let
// others in, so the listing is taken again.
func (l *Locker) holders(ctx context.Context, parent string) ([]holder, int, error) {
	for {
		names, err := call(ctx, l, "list", func() ([]string, error) {
			names, _, err := l.conn.Children(parent)
			return names, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil, 0, nil
		}
		if err != nil {
			return nil, 0, err
		}
		q := queue(nil, names)
		n := 0
		for n < len(q) {
			if holds, _, _ := decide(q, n, 0); !holds {
				break
			}
			n++
		}
		hs, err := l.readHolders(ctx, parent, q[:n])
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		return hs, len(q) - n, nil
	}
}

type nodeData struct {
	data []byte
	stat *zk.Stat
}

// readHolders reads the label (the node's data) and token (its czxid) of
// each of cs, failing with zk.ErrNoNode when one is gone.
func (l *Locker) readHolders(ctx context.Context, parent string, cs []contender) ([]holder, error) {
	hs := make([]holder, 0, len(cs))
	for _, c := range cs {
		node := parent + "/" + c.name
		d, err := call(ctx, l, "get", func() (nodeData, error) {
			data, stat, err := l.conn.Get(node)
			return nodeData{data, stat}, err
		})
		if err != nil {
			return nil, err
		}
		hs = append(hs, holder{node: node, version: d.stat.Version, Holding: driver.Holding{Owner: string(d.data), Token: uint64(d.stat.Czxid), SessionBound: true}})
	}
	return hs, nil
}

func holdings(hs []holder) []driver.Holding {
	if len(hs) == 0 {
		return nil
	}
	out := make([]driver.Holding, len(hs))
	for i, h := range hs {
		out[i] = h.Holding
	}
	return out
}

// List implements driver.Lister for locks and read/write locks. ZooKeeper
// reads no range of children, so each call lists every lock parent under
// the root (one answer, which the server's jute.maxbuffer bounds: about a
// million bytes of names by default), and then inspects the candidates in
// key order until limit of them are held: parents that outlive their last
// contender for a while (container nodes are removed by the server's
// periodic check) are skipped at the cost of one request each. A lock whose
// parent or holder node the session may not read (another user's ACL) is
// listed with an Err wrapping zk.ErrNoAuth, since the root's listing shows
// that it exists.
func (l *Locker) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: list limit %d", driver.ErrInvalidOption, limit)
	}
	names, err := call(ctx, l, "list", func() ([]string, error) {
		names, _, err := l.conn.Children(l.root)
		return names, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, name := range names {
		if key, ok := unescape(name); ok && key > after && strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	var out []driver.Listed
	for _, key := range keys {
		hs, waiters, err := l.holders(ctx, l.lockPath(key))
		switch {
		case errors.Is(err, errDenied):
			out = append(out, driver.Listed{Key: key, Err: err})
		case err != nil:
			return nil, err
		case len(hs) > 0:
			out = append(out, driver.Listed{Key: key, Inspection: driver.Inspection{Holders: holdings(hs), Waiters: waiters}})
		}
		if len(out) == limit {
			break
		}
	}
	return out, nil
}

// unescape is the key whose lock parent is named name, if name is one: the
// inverse of escape. Semaphore parents ("~semaphore") and foreign nodes are
// not escape's output, which the round trip tells.
func unescape(name string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		if name[i] != '%' {
			b.WriteByte(name[i])
			continue
		}
		if i+2 >= len(name) {
			return "", false
		}
		c, err := strconv.ParseUint(name[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(c))
		i += 2
	}
	key := b.String()
	return key, key != "" && escape(key) == name
}

// ForceRelease implements driver.ForceReleaser for locks and read/write
// locks. A holding's token is its node's czxid, and its node's name carries
// a random id of its create (see enqueue), so the name stands for that one
// holding: ForceRelease deletes the node of the holding target names, with
// the data version it read, and never another contender's, so of a read
// lock's readers exactly the one named goes. A holder stays one until its
// node goes (only older nodes could stand before it), so the node read as a
// holder is still one when the delete runs; when the node has gone
// meanwhile, the holders are read again to say who holds the lock instead.
// With target.AnyHolder, every holder's node is deleted in one
// multi-operation, which fails as a whole when one of them is already gone
// (the listing is then taken again). The next holder is a contender queued
// behind the old holders or one that comes later: either way its node was
// created after theirs, so its czxid, the token, is greater.
//
// The old holder's session lives on, but its Locker has a data watch on
// each node it holds: the deletion reaches it as a watch event, and its
// lease calls the function guard gave OnRevoke (driver.RevocableLease), so
// guard cancels its section with guard.ErrLockLost. That takes a round trip
// from the ensemble to the holder, during which it may still write: fenced
// storage is what refuses its writes then, and for as long as the event is
// delayed: a holder disconnected at the time hears of the deletion when it
// reconnects. A driver user that never calls OnRevoke learns of it only
// from its Release, which finds the node gone and returns
// driver.ErrNotHeld.
func (l *Locker) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	parent := l.lockPath(key)
	for {
		hs, _, err := l.holders(ctx, parent)
		if err != nil || len(hs) == 0 {
			// Nothing was deleted: a delete sent before this read failed
			// whole.
			return nil, driver.NotSent(err)
		}
		var ops []any
		var removed []holder
		for _, h := range hs {
			if target.AnyHolder || target.Matches(h.Holding) {
				ops = append(ops, &zk.DeleteRequest{Path: h.node, Version: h.version})
				removed = append(removed, h)
			}
		}
		if len(removed) == 0 {
			return nil, driver.HolderChanged(holdings(hs))
		}
		_, err = call(ctx, l, "force release", func() ([]zk.MultiResponse, error) { return l.conn.Multi(ops...) })
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			continue
		}
		if err != nil {
			return nil, notSentOr(err)
		}
		return holdings(removed), nil
	}
}

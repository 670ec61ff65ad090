package zklock

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

const (
	// DefaultStoreRoot is the node under which a Store keeps its records
	// unless WithStoreRoot says otherwise. It is apart from DefaultRoot so
	// that a Locker and a Store with default options never share a parent.
	DefaultStoreRoot = "/warden/idem"
	// DefaultStoreRequestTimeout bounds each request a Store makes unless
	// WithStoreRequestTimeout says otherwise. The client library queues
	// requests while it has no connection and takes no context, so without a
	// bound of its own a call on an unreachable ensemble would last as long
	// as the caller's context, forever for context.Background().
	DefaultStoreRequestTimeout = 5 * time.Second
)

// Store is an idempotency.Store on ZooKeeper. It is safe for concurrent use.
//
// # Layout
//
// The record of (scope, key) is the persistent node
// <root>/<bucket>/<name>, where name is the length of the scope in decimal, a
// ':', then the scope and the key, escaped as lock keys are (bytes outside
// [A-Za-z0-9_:.-] become %XX), so that any bytes make one valid node name and
// no two pairs share one; bucket is two hex digits of a hash of the same
// bytes, so that no directory grows with the whole store and Purge lists a
// bounded share of it at a time. The 256 buckets are persistent nodes made on
// first use. Do not give a Store and a Locker the same root: a lock key of two
// hex digits would be a bucket.
//
// # Time
//
// Every lease and retention is counted on the ensemble's clock, never the
// application's: ZooKeeper stamps each write of a node with the leader's time
// (Stat.Mtime, in ms), and a record keeps the duration its last write was
// given, so it is live until that write's Mtime plus the duration. To judge a
// record it has read, the store needs the server's current time, which no
// read reveals: it writes the bucket node (an empty SetData, which changes
// nothing any record depends on) and takes that write's Mtime. Durations are
// rounded up to whole milliseconds and a record counts as expired only once
// the clock is past its deadline, so a lease never ends sooner than asked.
// The leaders' clocks are assumed roughly in step and not stepped back: a
// new leader whose clock is behind lengthens leases, one whose clock is ahead
// shortens them.
//
// # Fencing
//
// Every change is conditional on the record's version as read when the
// owner token was checked, so of two writers only one wins. ZooKeeper
// restarts versions at zero when a node is deleted and created again, so a
// version alone could let a stale owner write to the record of the owner
// that took over; each record is therefore created, in one transaction
// (multi), with a child "i-<id>" named after 16 random bytes that are also in
// its data, and every later write is a transaction that checks or deletes
// that child too: it succeeds only on the very node the token was checked
// on.
//
// Extend and Complete write first and judge after: the Mtime of their own
// write is the time it took effect, and if that is past the lease the old
// version was given, the lease had run out first; the write is then undone
// (the record deleted, as expiry would have) and ErrNotOwner returned. For
// that moment a reader may see the late write: an extended claim, which only
// delays a retry, or a completed record whose response it may replay, a
// genuine result of the request.
//
// # Responses
//
// ZooKeeper refuses a request of 1 MiB or more (jute.maxbuffer) by dropping
// the connection, so a response of more than 256 KiB is stored in parts of
// up to 256 KiB, children of the record created before the write that
// completes it and deleted with it in the same transaction. The fingerprint
// and the owner token together may not exceed 64 KiB (ErrInvalid). The
// ensemble keeps every node in memory on every server: a response costs its
// size in each server's heap for the whole retention.
//
// # Cleanup
//
// An expired record is deleted by whichever call meets it (Claim, Get), in a
// transaction fenced like any other write, and Claim then creates the new one.
// Records whose key never comes again stay until Purge deletes them: run it
// now and then, from one instance or several (concurrent purges are safe,
// only wasteful). Purge reads every record, so its cost grows with the
// number kept.
//
// # Failures
//
// Every request is bounded by the request timeout (WithStoreRequestTimeout)
// and by the caller's context: a request that gets no answer in time, or
// that the client library fails (connection lost, session expired), is an
// error wrapping idempotency.ErrUnavailable, and the caller's own
// cancellation or deadline is reported as ctx's error. A write whose answer
// was lost may still have been applied; a Claim cut off that way retries and
// recognises its own record.
//
// A request the ACL of the store's znodes refuses (zk.ErrNoAuth: a
// connection without their user's credentials; zk.ErrInvalidACL: a
// WithStoreACL the server will not set) wraps idempotency.ErrInvalid and the
// zk error instead: an Executor passes it on rather than as an outage, so
// that httpmw's WithFailOpen does not serve keyed requests unguarded until
// someone mends the setup.
type Store struct {
	conn    *zk.Conn
	root    string
	acl     []zk.ACL
	timeout time.Duration
}

var _ idempotency.Store = (*Store)(nil)

// StoreOption configures a Store. An invalid value makes NewStore fail.
type StoreOption func(*storeConfig) error

type storeConfig struct {
	root    string
	acl     []zk.ACL
	timeout time.Duration
}

// invalidOption reports a bad NewStore argument. It wraps both sentinels: the
// one every backend's constructor uses and the one idempotency callers test.
func invalidOption(format string, args ...any) error {
	return fmt.Errorf("%w: %w: zookeeper store: %s", driver.ErrInvalidOption, idempotency.ErrInvalid, fmt.Sprintf(format, args...))
}

// WithStoreRoot sets the node under which the records live: a path
// ZooKeeper accepts, as WithRoot's. Stores meant to share records use the
// same root. It is created on first use.
func WithStoreRoot(path string) StoreOption {
	return func(c *storeConfig) error {
		if err := checkRoot(path); err != nil {
			return invalidOption("root %q: %v", path, err)
		}
		c.root = path
		return nil
	}
}

// WithStoreACL sets the ACL of every node the store creates (default: world
// readable and writable, zk.WorldACL(zk.PermAll)). An ACL that grants
// create to an identity no entry matching it grants delete is refused, as
// WithACL refuses it.
func WithStoreACL(acl ...zk.ACL) StoreOption {
	return func(c *storeConfig) error {
		// The records' parent is made with it too, and a record must
		// be deletable by whoever may create one (Delete, Purge).
		if err := checkACL(acl); err != nil {
			return invalidOption("ACL: %v", err)
		}
		c.acl = acl
		return nil
	}
}

// WithStoreRequestTimeout bounds each request the store makes to the
// ensemble; d must be positive. Default DefaultStoreRequestTimeout.
func WithStoreRequestTimeout(d time.Duration) StoreOption {
	return func(c *storeConfig) error {
		if d <= 0 {
			return invalidOption("request timeout %v is not positive", d)
		}
		c.timeout = d
		return nil
	}
}

// NewStore returns a store that keeps its records in the ensemble conn is
// connected to. The connection stays the caller's (close it after the last
// call); the store holds no resources of its own and makes no request until
// it is used. A Locker keeps its own session, which is not shared: connect
// once more with zk.Connect. Unlike a Locker's, a zk.Conn of the caller's
// never connects again to an ensemble that lost its data (it keeps
// offering the last transaction id it saw, which such a server refuses;
// see wipe.go): the store's calls then fail as unavailable, and a store on
// a new connection is needed. Errors wrap driver.ErrInvalidOption and
// idempotency.ErrInvalid.
//
// On an ensemble whose ACLs ask for credentials, the caller adds them to
// conn (conn.AddAuth("digest", []byte("user:password")), which waits for
// the session) before the store's first call; go-zookeeper sends them
// again on each connection it makes after. The store cannot see them, so
// WithStoreACL judges an ACL without them: a digest ACL for conn's own
// user, or zk.AuthACL, makes nodes conn may use, and one for another user
// nodes it may not, whose requests fail with zk.ErrNoAuth.
func NewStore(conn *zk.Conn, opts ...StoreOption) (*Store, error) {
	if conn == nil {
		return nil, invalidOption("nil *zk.Conn")
	}
	c := storeConfig{root: DefaultStoreRoot, acl: zk.WorldACL(zk.PermAll), timeout: DefaultStoreRequestTimeout}
	for _, o := range opts {
		if o == nil {
			return nil, invalidOption("nil option")
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return &Store{conn: conn, root: c.root, acl: c.acl, timeout: c.timeout}, nil
}

const (
	// partSize is the largest response kept in the record itself, and the
	// size of the parts a larger one is cut into: with the fingerprint and
	// owner limit, every request stays far below jute.maxbuffer's 1 MiB.
	partSize = 256 << 10
	// maxHeader bounds the fingerprint and owner together.
	maxHeader = 64 << 10
	// maxAttempts bounds how often Claim and Get start over when the record
	// changes under them; each new attempt means another caller progressed.
	maxAttempts = 8
)

// place returns the paths of (scope, key)'s bucket and record.
func (s *Store) place(scope, key string) (bucket, record string) {
	id := strconv.Itoa(len(scope)) + ":" + scope + key
	h := fnv.New32a()
	h.Write([]byte(id))
	bucket = fmt.Sprintf("%s/%02x", s.root, byte(h.Sum32()))
	return bucket, bucket + "/" + escape(id)
}

// isBucket tells a bucket's name from anything else an operator may have put
// under the root.
func isBucket(name string) bool {
	if len(name) != 2 {
		return false
	}
	_, err := hex.DecodeString(name)
	return err == nil && strings.ToLower(name) == name
}

// Claim implements idempotency.Store: one transaction creates the record and
// its incarnation child, or, when the record exists, the store reads it,
// deletes it if it has expired and tries again, or returns it.
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), c.Check()); err != nil {
		return nil, err
	}
	if n := len(c.Fingerprint) + len(c.Owner); n > maxHeader {
		return nil, fmt.Errorf("%w: fingerprint and owner of %d bytes, more than the %d a zookeeper store keeps", idempotency.ErrInvalid, n, maxHeader)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	bucket, path := s.place(c.Scope, c.Key)
	r := stored{state: idempotency.StateInProgress, dur: millis(c.Lease), fingerprint: c.Fingerprint, owner: c.Owner}
	rand.Read(r.inc[:])
	rand.Read(r.wid[:])
	data := r.encode(nil)
	var err error
	for range maxAttempts {
		_, err = storeCall(ctx, s, "claim", func() ([]zk.MultiResponse, error) {
			return s.conn.Multi(
				&zk.CreateRequest{Path: path, Data: data, Acl: s.acl, Flags: zk.FlagPersistent},
				&zk.CreateRequest{Path: path + "/" + r.marker(), Acl: s.acl, Flags: zk.FlagPersistent})
		})
		switch {
		case err == nil:
			return nil, nil
		case errors.Is(err, zk.ErrNoNode):
			if err = s.ensure(ctx, bucket); err != nil {
				return nil, err
			}
			continue
		case errors.Is(err, zk.ErrNodeExists):
		case outcomeUnknown(err) && ctx.Err() == nil:
			// The create may have been applied: the next attempt finds
			// out, by the incarnation id, whether the record is this one.
			continue
		default:
			return nil, err
		}
		live, cur, lerr := s.live(ctx, bucket, path, c.Scope, c.Key)
		switch {
		case lerr != nil:
			return nil, lerr
		case live == nil:
			continue
		case cur.inc == r.inc:
			return nil, nil
		}
		return live, nil
	}
	return nil, fmt.Errorf("%w: zookeeper idempotency claim of %q: the record kept changing (%d attempts, the last: %v)", idempotency.ErrUnavailable, c.Key, maxAttempts, err)
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(lease)); err != nil {
		return err
	}
	_, path := s.place(scope, key)
	old, stat, err := s.owned(ctx, path, key, owner, "extend")
	if err != nil {
		return err
	}
	r := old
	r.dur = millis(lease)
	rand.Read(r.wid[:])
	return s.update(ctx, path, key, "extend", old, stat, r, r.encode(nil))
}

// Complete implements idempotency.Store. A response too large for the record
// is written in parts first, each in a transaction that checks the claim's
// incarnation, so that parts never land under another owner's record.
func (s *Store) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(retention), idempotency.CheckResponse(response)); err != nil {
		return err
	}
	_, path := s.place(scope, key)
	old, stat, err := s.owned(ctx, path, key, owner, "complete")
	if err != nil {
		return err
	}
	r := old
	r.state, r.dur, r.total = idempotency.StateCompleted, millis(retention), len(response)
	rand.Read(r.wid[:])
	inline := response
	if len(response) > partSize {
		inline = nil
		r.parts = (len(response) + partSize - 1) / partSize
		for i := range r.parts {
			part := response[i*partSize : min((i+1)*partSize, len(response))]
			_, err := storeCall(ctx, s, "complete", func() ([]zk.MultiResponse, error) {
				return s.conn.Multi(
					&zk.CheckVersionRequest{Path: path + "/" + r.marker(), Version: -1},
					&zk.CreateRequest{Path: path + "/" + r.part(i), Data: part, Acl: s.acl, Flags: zk.FlagPersistent})
			})
			if err != nil {
				if answered(err) {
					s.dropParts(ctx, path, r, i)
					return notOwner("complete", key)
				}
				return err
			}
		}
	}
	err = s.update(ctx, path, key, "complete", old, stat, r, r.encode(inline))
	if errors.Is(err, idempotency.ErrNotOwner) {
		s.dropParts(ctx, path, r, r.parts)
	}
	return err
}

// Abandon implements idempotency.Store. An owner may abandon a claim whose
// lease has run out but that no one has deleted yet: no one else holds it.
func (s *Store) Abandon(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner)); err != nil {
		return err
	}
	_, path := s.place(scope, key)
	r, stat, err := s.owned(ctx, path, key, owner, "abandon")
	if err != nil {
		return driver.NotSent(err) // a read's, before any delete
	}
	err = s.remove(ctx, path, stat.Version, r)
	if answered(err) {
		return notOwner("abandon", key)
	}
	return err
}

// Delete implements idempotency.Deleter. A record rewritten between the
// read and the delete is read again, a few times at most; the delete names
// the version read, so a record claimed by another owner since is never
// removed.
func (s *Store) Delete(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return err
	}
	_, path := s.place(scope, key)
	for range 3 {
		r, stat, err := s.read(ctx, path)
		if errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
		}
		if err != nil {
			// A read's: nothing was deleted, the deletes sent before it
			// having failed whole.
			return driver.NotSent(err)
		}
		if owner != "" && r.owner != owner {
			return fmt.Errorf("%w: delete of %q: the record has another owner", idempotency.ErrNotOwner, key)
		}
		err = s.remove(ctx, path, stat.Version, r)
		if !errors.Is(err, zk.ErrBadVersion) && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
	}
	return fmt.Errorf("%w: zookeeper delete: the record kept changing", idempotency.ErrUnavailable)
}

// Get implements idempotency.Store. Like Claim, it deletes an expired record
// it meets.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	bucket, path := s.place(scope, key)
	rec, _, err := s.live(ctx, bucket, path, scope, key)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
	}
	return rec, nil
}

// Purge deletes the records whose lease or retention has run out, which
// Claim and Get would otherwise delete only if their key came again. Run it
// now and then; it returns how many records it deleted. Nodes under the root
// that this store did not write are left alone. It stops at the first
// failure to reach the ensemble, reporting the records deleted so far.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	if err := idempotency.CheckContext(ctx); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	buckets, err := s.children(ctx, s.root)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, b := range buckets {
		if !isBucket(b) {
			continue
		}
		bucket := s.root + "/" + b
		names, err := s.children(ctx, bucket)
		if err != nil {
			return n, err
		}
		if len(names) == 0 {
			continue
		}
		// One reading of the clock serves the whole bucket: a record
		// written after it is younger than it and is rightly kept.
		now, err := s.now(ctx, bucket)
		if err != nil {
			return n, err
		}
		for _, name := range names {
			path := bucket + "/" + name
			r, stat, err := s.read(ctx, path)
			switch {
			case errors.Is(err, zk.ErrNoNode), errors.Is(err, errMalformed):
				continue
			case err != nil:
				return n, err
			case !r.expired(stat, now):
				continue
			}
			switch err := s.remove(ctx, path, stat.Version, r); {
			case err == nil:
				n++
			case !answered(err):
				return n, err
			}
		}
	}
	return n, nil
}

// Ping reports whether the store's ensemble answers, as Locker.Ping does:
// one read of the root (which need not exist yet), bounded by the request
// timeout and by ctx, for health checks and for refusing to start on a wrong
// address.
func (s *Store) Ping(ctx context.Context) error {
	if err := idempotency.CheckContext(ctx); err != nil {
		return err
	}
	_, err := storeCall(ctx, s, "ping", func() (bool, error) {
		ok, _, err := s.conn.Exists(s.root)
		return ok, err
	})
	return err
}

// live returns the live record at path, with its stored form, or a nil record
// when there is none: absent, or expired, in which case it deletes it. When
// the delete finds the record changed, it looks again. A completed record's
// parts are read too.
func (s *Store) live(ctx context.Context, bucket, path, scope, key string) (*idempotency.Record, stored, error) {
	for range maxAttempts {
		r, stat, err := s.read(ctx, path)
		if errors.Is(err, zk.ErrNoNode) {
			return nil, stored{}, nil
		}
		if err != nil {
			return nil, stored{}, err
		}
		now, err := s.now(ctx, bucket)
		if err != nil {
			return nil, stored{}, err
		}
		if r.expired(stat, now) {
			switch err := s.remove(ctx, path, stat.Version, r); {
			case err == nil:
				return nil, stored{}, nil
			case !answered(err):
				return nil, stored{}, err
			}
			continue
		}
		if r.parts > 0 {
			// Referenced parts are only deleted with their record, in one
			// transaction: a missing part means the record went in the
			// meantime, and reading it again tells what replaced it.
			if r.response, err = s.readParts(ctx, path, r); errors.Is(err, zk.ErrNoNode) {
				continue
			} else if err != nil {
				return nil, stored{}, err
			}
		}
		return r.record(scope, key), r, nil
	}
	return nil, stored{}, fmt.Errorf("%w: zookeeper idempotency: record %q kept changing (%d attempts)", idempotency.ErrUnavailable, key, maxAttempts)
}

// owned reads the record at path and returns it when owner holds it in
// progress, or ErrNotOwner. The lease is not judged here: the write that
// follows is, by its own time.
func (s *Store) owned(ctx context.Context, path, key, owner, op string) (stored, *zk.Stat, error) {
	if err := ctx.Err(); err != nil {
		return stored{}, nil, err
	}
	r, stat, err := s.read(ctx, path)
	if errors.Is(err, zk.ErrNoNode) {
		return stored{}, nil, notOwner(op, key)
	}
	if err != nil {
		return stored{}, nil, err
	}
	if r.state != idempotency.StateInProgress || r.owner != owner {
		return stored{}, nil, notOwner(op, key)
	}
	return r, stat, nil
}

// update replaces the record old, read at stat, with r (encoded as data), in
// a transaction fenced by old's incarnation and version, then judges by the
// write's own time whether old's lease had run out before it; if so it
// deletes the record again and returns ErrNotOwner.
func (s *Store) update(ctx context.Context, path, key, op string, old stored, stat *zk.Stat, r stored, data []byte) error {
	res, err := storeCall(ctx, s, op, func() ([]zk.MultiResponse, error) {
		return s.conn.Multi(
			&zk.CheckVersionRequest{Path: path + "/" + old.marker(), Version: -1},
			&zk.SetDataRequest{Path: path, Data: data, Version: stat.Version})
	})
	if answered(err) {
		return notOwner(op, key)
	}
	if err != nil {
		return err
	}
	if len(res) != 2 || res[1].Stat == nil {
		return fmt.Errorf("%w: zookeeper idempotency %s of %q: malformed transaction answer", idempotency.ErrUnavailable, op, key)
	}
	if written := res[1].Stat; old.expired(stat, written.Mtime) {
		// Undone in a context of its own: the caller giving up must not
		// leave an expired claim revived.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		defer cancel()
		if err := s.remove(dctx, path, written.Version, r); err != nil && !answered(err) {
			return fmt.Errorf("%w: %s of %q: lease expired, and undoing the late write failed: %v", idempotency.ErrNotOwner, op, key, err)
		}
		return fmt.Errorf("%w: %s of %q: lease expired", idempotency.ErrNotOwner, op, key)
	}
	return nil
}

// remove deletes the record r, read at version, with its incarnation child
// and parts, in one transaction. Children it does not know of (parts of a
// completion that failed half way) make the transaction fail as not empty;
// it then lists them and deletes them too. A zk.ErrNoNode or
// zk.ErrBadVersion means the record is no longer that one.
func (s *Store) remove(ctx context.Context, path string, version int32, r stored) error {
	known := []string{r.marker()}
	for i := range r.parts {
		known = append(known, r.part(i))
	}
	names := known
	for range 3 {
		ops := make([]any, 0, len(names)+1)
		for _, name := range names {
			ops = append(ops, &zk.DeleteRequest{Path: path + "/" + name, Version: -1})
		}
		ops = append(ops, &zk.DeleteRequest{Path: path, Version: version})
		_, err := storeCall(ctx, s, "delete", func() ([]zk.MultiResponse, error) { return s.conn.Multi(ops...) })
		if !errors.Is(err, zk.ErrNotEmpty) {
			return notSentOr(err)
		}
		kids, err := s.children(ctx, path)
		if err != nil {
			return driver.NotSent(err) // the delete failed whole
		}
		// The incarnation child goes first and is kept even if the
		// listing lacks it: deleting it is what proves the node is r's.
		names = append(names[:0:0], known[0])
		for _, k := range kids {
			if k != known[0] {
				names = append(names, k)
			}
		}
	}
	return fmt.Errorf("%w: zookeeper idempotency delete of %s: children keep appearing", idempotency.ErrUnavailable, path)
}

// dropParts deletes, best effort, the first n parts of a completion that did
// not take effect. Parts are named after the write, so no other record's
// parts can be hit; any left over go with their record.
func (s *Store) dropParts(ctx context.Context, path string, r stored, n int) {
	if n == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	for i := range n {
		storeCall(dctx, s, "delete", func() (struct{}, error) {
			return struct{}{}, s.conn.Delete(path+"/"+r.part(i), -1)
		})
	}
}

// read returns the record at path and its stat.
func (s *Store) read(ctx context.Context, path string) (stored, *zk.Stat, error) {
	type got struct {
		data []byte
		stat *zk.Stat
	}
	g, err := storeCall(ctx, s, "read", func() (got, error) {
		data, stat, err := s.conn.Get(path)
		return got{data, stat}, err
	})
	if err != nil {
		return stored{}, nil, err
	}
	r, err := decode(g.data)
	return r, g.stat, err
}

// readParts reads and joins the parts of a completed record.
func (s *Store) readParts(ctx context.Context, path string, r stored) ([]byte, error) {
	resp := make([]byte, 0, r.total)
	for i := range r.parts {
		data, err := storeCall(ctx, s, "read", func() ([]byte, error) {
			data, _, err := s.conn.Get(path + "/" + r.part(i))
			return data, err
		})
		if err != nil {
			return nil, err
		}
		resp = append(resp, data...)
	}
	if len(resp) != r.total {
		return nil, errMalformed
	}
	return resp, nil
}

// children lists path's children; a missing path has none.
func (s *Store) children(ctx context.Context, path string) ([]string, error) {
	names, err := storeCall(ctx, s, "list", func() ([]string, error) {
		names, _, err := s.conn.Children(path)
		return names, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	return names, err
}

// now returns the ensemble's current time, in ms, as the Mtime of an empty
// write to bucket, creating it if needed. Any write would do; the bucket is
// one the caller's record lives under, which spreads these writes over 256
// nodes.
func (s *Store) now(ctx context.Context, bucket string) (int64, error) {
	for range 2 {
		stat, err := storeCall(ctx, s, "clock", func() (*zk.Stat, error) {
			return s.conn.Set(bucket, nil, -1)
		})
		if err == nil {
			return stat.Mtime, nil
		}
		if !errors.Is(err, zk.ErrNoNode) {
			return 0, err
		}
		if err := s.ensure(ctx, bucket); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("%w: zookeeper idempotency: bucket %s keeps disappearing", idempotency.ErrUnavailable, bucket)
}

// ensure creates the root's missing ancestors, the root and bucket, all
// persistent.
func (s *Store) ensure(ctx context.Context, bucket string) error {
	p := ""
	for _, part := range strings.Split(bucket[1:], "/") {
		p += "/" + part
		node := p
		_, err := storeCall(ctx, s, "create parent", func() (string, error) {
			return s.conn.Create(node, nil, zk.FlagPersistent, s.acl)
		})
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// storeCall runs one ZooKeeper request, bounded by the store's request
// timeout and by ctx (the client library takes no context). The answers the
// store acts on (no node, node exists, bad version, not empty) come back as
// the zk errors; a refusal by an ACL wraps idempotency.ErrInvalid (see
// Store); every other failure wraps idempotency.ErrUnavailable, except that
// the caller's own cancellation or deadline is ctx's error.
func storeCall[T any](ctx context.Context, s *Store, op string, fn func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := fn()
		ch <- result{v, err}
	}()
	timeout := time.NewTimer(s.timeout)
	defer timeout.Stop()
	select {
	case r := <-ch:
		switch {
		case r.err == nil || answered(r.err):
			return r.v, r.err
		case deniedByACL(r.err) && ctx.Err() == nil:
			return r.v, fmt.Errorf("%w: zookeeper idempotency %s refused by the ACL of the store's znodes, a setup to mend"+
				" (the credentials of their user on the connection, conn.AddAuth, or a root of the connection's own user, WithStoreRoot): %w",
				idempotency.ErrInvalid, op, r.err)
		}
		return r.v, driver.Unavailable(ctx, fmt.Errorf("zookeeper idempotency %s: %w", op, r.err))
	case <-timeout.C:
		return zero, fmt.Errorf("%w: zookeeper idempotency %s: no answer within %v", idempotency.ErrUnavailable, op, s.timeout)
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// answered reports whether err is the server's answer to a condition, as
// opposed to a failure to get one.
func answered(err error) bool {
	return errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNodeExists) ||
		errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNotEmpty)
}

// outcomeUnknown reports whether a write failed after it may have reached
// the server.
func outcomeUnknown(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrSessionExpired)
}

func notOwner(op, key string) error {
	return fmt.Errorf("%w: %s of %q", idempotency.ErrNotOwner, op, key)
}

// millis rounds d up to whole milliseconds, the unit of ZooKeeper's clock, so
// that a lease never ends sooner than asked.
func millis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// stored is a record as its node holds it.
type stored struct {
	state idempotency.State
	// dur is the lease or retention, in ms, that the record's last write
	// was given: the record lives until that write's Mtime plus dur.
	dur int64
	// inc names the incarnation child, created with the record.
	inc [16]byte
	// wid is unique to the record's last write; a completion's parts are
	// named after it.
	wid         [8]byte
	parts       int
	total       int
	fingerprint string
	owner       string
	response    []byte
}

// expired judges the record, whose last write has stat, at the server time
// now (ms). Mtime truncates the write's time to the millisecond, so only a
// time past Mtime+dur proves that dur has fully elapsed.
func (r stored) expired(stat *zk.Stat, now int64) bool { return now > stat.Mtime+r.dur }

func (r stored) marker() string { return "i-" + hex.EncodeToString(r.inc[:]) }

func (r stored) part(i int) string {
	return "p-" + hex.EncodeToString(r.wid[:]) + "-" + strconv.Itoa(i)
}

func (r stored) record(scope, key string) *idempotency.Record {
	return &idempotency.Record{
		Scope: scope, Key: key,
		State:       r.state,
		Fingerprint: r.fingerprint,
		Owner:       r.owner,
		Response:    r.response,
	}
}

// recordFormat versions the encoding, so that a later layout can be told
// from this one.
const recordFormat = 1

const (
	stateInProgress byte = 1
	stateCompleted  byte = 2
)

// encode lays r out as: format, state, incarnation id, write id, uvarint
// duration, part count and response length, uvarint-prefixed fingerprint and
// owner, then the inline response to the end.
func (r stored) encode(inline []byte) []byte {
	b := make([]byte, 0, 2+len(r.inc)+len(r.wid)+5*binary.MaxVarintLen64+len(r.fingerprint)+len(r.owner)+len(inline))
	st := stateInProgress
	if r.state == idempotency.StateCompleted {
		st = stateCompleted
	}
	b = append(b, recordFormat, st)
	b = append(b, r.inc[:]...)
	b = append(b, r.wid[:]...)
	b = binary.AppendUvarint(b, uint64(r.dur))
	b = binary.AppendUvarint(b, uint64(r.parts))
	b = binary.AppendUvarint(b, uint64(r.total))
	b = binary.AppendUvarint(b, uint64(len(r.fingerprint)))
	b = append(b, r.fingerprint...)
	b = binary.AppendUvarint(b, uint64(len(r.owner)))
	b = append(b, r.owner...)
	return append(b, inline...)
}

var errMalformed = fmt.Errorf("%w: zookeeper: malformed idempotency record", idempotency.ErrUnavailable)

// decode reverses encode. Data it cannot read was not written by this store
// (or by a newer format): it is reported as the store being unusable rather
// than as a free key, which would let a second owner in.
func decode(v []byte) (stored, error) {
	var r stored
	if len(v) < 2+len(r.inc)+len(r.wid) || v[0] != recordFormat {
		return stored{}, errMalformed
	}
	switch v[1] {
	case stateInProgress:
		r.state = idempotency.StateInProgress
	case stateCompleted:
		r.state = idempotency.StateCompleted
	default:
		return stored{}, errMalformed
	}
	rest := v[2:]
	rest = rest[copy(r.inc[:], rest):]
	rest = rest[copy(r.wid[:], rest):]
	num := func(limit uint64) (uint64, bool) {
		x, n := binary.Uvarint(rest)
		if n <= 0 || x > limit {
			return 0, false
		}
		rest = rest[n:]
		return x, true
	}
	field := func() (string, bool) {
		l, ok := num(uint64(len(rest)))
		if !ok || l > uint64(len(rest)) {
			return "", false
		}
		f := string(rest[:l])
		rest = rest[l:]
		return f, true
	}
	dur, ok1 := num(1 << 62)
	parts, ok2 := num(1 << 20)
	total, ok3 := num(1 << 40)
	if !ok1 || !ok2 || !ok3 {
		return stored{}, errMalformed
	}
	r.dur, r.parts, r.total = int64(dur), int(parts), int(total)
	var ok bool
	if r.fingerprint, ok = field(); !ok {
		return stored{}, errMalformed
	}
	if r.owner, ok = field(); !ok {
		return stored{}, errMalformed
	}
	switch {
	case r.parts > 0 && (len(rest) != 0 || r.state != idempotency.StateCompleted):
		return stored{}, errMalformed
	case r.parts == 0 && len(rest) != r.total:
		return stored{}, errMalformed
	case len(rest) > 0:
		r.response = append([]byte(nil), rest...)
	}
	return r, nil
}

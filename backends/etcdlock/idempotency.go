package etcdlock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/backends/internal/idemrecord"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// DefaultStorePrefix is the etcd key prefix of the idempotency records unless
// WithStorePrefix says otherwise; records live under <prefix>/idem/.
const DefaultStorePrefix = "warden"

// Store is an idempotency.Store on etcd. It is safe for concurrent
// use.
//
// # Expiry
//
// etcd has no clock a transaction can read, so every record is a key attached
// to an etcd lease, and the lease's TTL, counted by the etcd leader, is the
// record's life. Leases are shared: the store grants one lease per duration
// at a time, with a TTL one second longer than the duration, and attaches to
// it every record written with that duration within half a second of the
// grant's send time, so that a claim or a completion costs one transaction
// and no grant of its own (two grants a second per duration at most), and
// every record still lives at least as long as asked, at most a second
// longer.
// TTLs are whole seconds, so durations are rounded up to the next second,
// and the server raises any TTL below its minimum (2 s with the default 1 s
// election timeout; see MinTTL) to that minimum. A shared lease is never
// kept alive nor revoked: Extend and Complete move the record to another
// lease instead, so no owner's write lengthens anyone else's claim, and a
// claim whose process crashed is deleted when its lease runs out.
//
// The leader revokes expired leases on a timer (every 500 ms), so a record
// whose lease ran out stays readable, and blocks Claim, until the revocation
// is applied: typically under a second after the TTL. That lag only delays
// the next owner. A claim expires when the leader deletes it: Extend,
// Complete and Abandon are transactions that compare the key's mod revision
// with the claim's, so none of them applies once the revocation has deleted
// the record, and no one else can have claimed the key before then. The
// leader revokes a lease's records in one transaction, and the leases of
// one duration are granted at least half a second apart, one revocation tick
// of the leader, so claims of one duration expire in the order they were
// taken but for leases that expire in the same tick, which the leader
// revokes in no fixed order. A leader change extends every lease by up to an
// election timeout, never shortens one.
//
// # Fencing
//
// Every change of a record after Claim is a transaction that compares the
// key's mod revision with the one of the owner's claim, so a stale owner's
// write can never land on a newer owner's record, nor on a completed one.
// The store remembers the revision of each claim it made until the claim is
// completed or abandoned (or its lease has surely run out), so that the
// owner's Complete is that one transaction; an owner whose claim another
// Store made reads the record first.
//
// # Layout and size
//
// A record is the key <prefix>/idem/<base64url of the scope's length as a
// uvarint, the scope and the key>, so no two (scope, key) pairs share a key
// and any bytes are allowed. Its value is a small binary encoding of the
// state, the lease TTL asked for, the fingerprint, the owner and the
// response. A record with a response of idempotency.MaxResponseLen (1 MiB) is
// a request of about 1 MiB + 1 KiB, within etcd's default request limit of
// 1.5 MiB (--max-request-bytes) and the client's default send limit of 2 MiB.
//
// # Failures
//
// Every request is bounded by the request timeout (WithStoreRequestTimeout):
// one that gets no answer in time fails with an error wrapping
// idempotency.ErrUnavailable (which is driver.ErrUnavailable), while the
// caller's own cancellation is reported as ctx's error.
//
// A request etcd refuses for want of rights (a user without read and write
// on the store's prefix) fails with etcd's words wrapping
// idempotency.ErrInvalid, not ErrUnavailable: an Executor passes it on
// rather than as an outage, so that httpmw's WithFailOpen does not serve
// keyed requests unguarded until someone mends the user's role.
type Store struct {
	client  *clientv3.Client
	dir     string
	timeout bound

	mu sync.Mutex
	// leases are the shared leases by TTL in seconds (see Expiry).
	leases map[int64]*sharedLease
	// claims are the claims this store made and has not seen end, by etcd
	// key, so that their owner's Complete, Extend and Abandon need no read.
	claims map[string]claim
	// sweepAt is the size of claims at which the expired ones are dropped.
	sweepAt int
}

// sharedLease is a lease of one TTL that records written within leaseReuse
// of its grant's send time attach to.
type sharedLease struct {
	ready chan struct{} // closed once the grant has answered
	id    clientv3.LeaseID
	err   error
	sent  time.Time
}

// A shared lease's TTL is leaseSlack longer than its records' durations,
// and records attach to it for leaseReuse after its grant was sent: the
// half second left over covers the time between the choice of the lease and
// the transaction that attaches a record to it.
const (
	leaseSlack = time.Second
	leaseReuse = leaseSlack / 2
)

// claim is what the store knows of an in-progress record it wrote.
type claim struct {
	owner string
	rev   int64 // the record's mod revision
	st    stored
	// until is when the claim's lease has surely run out, by the local
	// clock; the entry may be dropped then.
	until time.Time
}

// minSweep is the smallest claims size at which expired entries are swept.
const minSweep = 1024

var _ idempotency.Store = (*Store)(nil)

// StoreOption configures an Store.
type StoreOption func(*storeConfig) error

type storeConfig struct {
	prefix  string
	timeout bound
}

// WithStorePrefix puts the records under <prefix>/idem/ (a trailing '/' is
// implied), so that stores meant to share records use the same prefix and
// other applications' keys stay apart.
func WithStorePrefix(prefix string) StoreOption {
	return func(c *storeConfig) error {
		p := strings.TrimSuffix(prefix, "/")
		if p == "" {
			return fmt.Errorf("%w: empty etcd key prefix", driver.ErrInvalidOption)
		}
		c.prefix = p
		return nil
	}
}

// WithStoreRequestTimeout bounds each request the store makes to etcd; d
// must be positive. Default DefaultRequestTimeout.
func WithStoreRequestTimeout(d time.Duration) StoreOption {
	return func(c *storeConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: etcd request timeout %v is not positive", driver.ErrInvalidOption, d)
		}
		c.timeout = bound(d)
		return nil
	}
}

// NewStore returns a store that keeps its records in the etcd
// cluster client talks to. The client stays the caller's; the store holds no
// resources of its own and makes no request until it is used.
func NewStore(client *clientv3.Client, opts ...StoreOption) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil etcd client", driver.ErrInvalidOption)
	}
	c := storeConfig{prefix: DefaultStorePrefix, timeout: bound(DefaultRequestTimeout)}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", driver.ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return &Store{client: client, dir: c.prefix + "/idem/", timeout: c.timeout,
		leases: map[int64]*sharedLease{}, claims: map[string]claim{}, sweepAt: minSweep}, nil
}

// recordKey is idemrecord.Key under the store's directory, so that tools
// listing the prefix see one flat directory.
func (s *Store) recordKey(scope, key string) string {
	return idemrecord.Key(s.dir, scope, key)
}

// Claim implements idempotency.Store: one transaction puts the record on
// the shared lease of c.Lease only if the key does not exist, or else reads
// the record in the same revision.
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), c.Check()); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ttl := ttlSeconds(c.Lease)
	k := s.recordKey(c.Scope, c.Key)
	st := stored{state: idempotency.StateInProgress, ttl: ttl, fingerprint: c.Fingerprint, owner: c.Owner}
	v := encodeRecord(st)
	sent := time.Now()
	resp, err := s.onLease(ctx, ttl, func(id clientv3.LeaseID) (*clientv3.TxnResponse, error) {
		return call(ctx, s.timeout, func(rctx context.Context) (*clientv3.TxnResponse, error) {
			return s.client.Txn(rctx).
				If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
				Then(clientv3.OpPut(k, v, clientv3.WithLease(id))).
				Else(clientv3.OpGet(k)).
				Commit()
		})
	})
	if err != nil {
		// The put may have landed: take back this claim, and no other
		// (the owner is unique to it), which is what a caller told the
		// claim failed expects. If that fails too, the lease ends it.
		s.withdraw(ctx, k, v)
		return nil, err
	}
	if resp.Succeeded {
		s.remember(k, claim{owner: c.Owner, rev: resp.Header.Revision, st: st,
			until: sent.Add(time.Duration(ttl)*time.Second + leaseSlack)})
		return nil, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		// A transaction sees one revision: the key existed for the compare,
		// so the read in the same transaction found it.
		return nil, fmt.Errorf("%w: etcd: record %q vanished inside a transaction", idempotency.ErrUnavailable, c.Key)
	}
	rec, err := decodeRecord(kvs[0].Value)
	if err != nil {
		return nil, err
	}
	return rec.record(c.Scope, c.Key), nil
}

// Extend implements idempotency.Store: the record moves, in a transaction
// fenced by the claim's mod revision, to the shared lease of lease, so that
// it lives lease from now; a claim already deleted by its lease's expiry is
// not revived.
func (s *Store) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(lease)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	ttl := ttlSeconds(lease)
	sent := time.Now()
	cur, err := s.rewrite(ctx, k, key, owner, "extend", func(id clientv3.LeaseID, cur claim) clientv3.Op {
		cur.st.ttl = ttl
		return clientv3.OpPut(k, encodeRecord(cur.st), clientv3.WithLease(id))
	}, ttl)
	if err != nil {
		return err
	}
	cur.st.ttl = ttl
	s.remember(k, claim{owner: owner, rev: cur.rev, st: cur.st, until: sent.Add(time.Duration(ttl)*time.Second + leaseSlack)})
	return nil
}

// Complete implements idempotency.Store: the record moves, in a transaction
// fenced by the claim's mod revision, to the shared lease of the retention,
// so that the claim's TTL no longer bounds it. For a claim this store made,
// that transaction is the only request.
func (s *Store) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(retention), idempotency.CheckResponse(response)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	ttl := ttlSeconds(retention)
	_, err := s.rewrite(ctx, k, key, owner, "complete", func(id clientv3.LeaseID, cur claim) clientv3.Op {
		st := cur.st
		st.state, st.ttl, st.response = idempotency.StateCompleted, ttl, response
		return clientv3.OpPut(k, encodeRecord(st), clientv3.WithLease(id))
	}, ttl)
	s.forget(k)
	return err
}

// Abandon implements idempotency.Store: a delete fenced by the claim's mod
// revision.
func (s *Store) Abandon(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	_, err := s.rewrite(ctx, k, key, owner, "abandon", func(clientv3.LeaseID, claim) clientv3.Op {
		return clientv3.OpDelete(k)
	}, 0)
	s.forget(k)
	return err
}

// Delete implements idempotency.Deleter. A delete naming an owner is a
// transaction fenced by the mod revision of the record read, read again
// when the record changed meanwhile, a few times at most. Its errors, as
// ForceRelease's, never match driver.ErrNotSent.
func (s *Store) Delete(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	s.forget(k)
	if owner == "" {
		resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.DeleteResponse, error) {
			return s.client.Delete(rctx, k)
		})
		if err != nil {
			return err
		}
		if resp.Deleted == 0 {
			return fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
		}
		return nil
	}
	for range 3 {
		got, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.GetResponse, error) {
			return s.client.Get(rctx, k)
		})
		if err != nil {
			return err
		}
		if len(got.Kvs) == 0 {
			return fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
		}
		st, err := decodeRecord(got.Kvs[0].Value)
		if err != nil {
			return err
		}
		if st.owner != owner {
			return fmt.Errorf("%w: delete of %q: the record has another owner", idempotency.ErrNotOwner, key)
		}
		rev := got.Kvs[0].ModRevision
		resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.TxnResponse, error) {
			return s.client.Txn(rctx).
				If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
				Then(clientv3.OpDelete(k)).
				Commit()
		})
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("%w: etcd delete: the record kept changing", idempotency.ErrUnavailable)
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.GetResponse, error) {
		return s.client.Get(rctx, s.recordKey(scope, key))
	})
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
	}
	st, err := decodeRecord(resp.Kvs[0].Value)
	if err != nil {
		return nil, err
	}
	return st.record(scope, key), nil
}

// rewrite applies op, built for the claim's current version and, when ttl
// is positive, the shared lease of ttl, in a transaction fenced by that
// version's mod revision, when owner holds the record under k in progress.
// The version is the one this store remembers of its own claim, or else
// read first; a transaction that finds the record changed reads it in the
// same revision, so a change by another Store of the same owner's claim
// (its Extend) costs one more transaction, and anything else is
// ErrNotOwner. It returns the version op wrote.
func (s *Store) rewrite(ctx context.Context, k, key, owner, opName string, op func(clientv3.LeaseID, claim) clientv3.Op, ttl int64) (claim, error) {
	if err := ctx.Err(); err != nil {
		return claim{}, err
	}
	cur, ok := s.remembered(k, owner)
	if !ok {
		resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.GetResponse, error) {
			return s.client.Get(rctx, k)
		})
		if err != nil {
			return claim{}, err
		}
		if cur, err = inProgress(resp.Kvs, key, owner, opName); err != nil {
			return claim{}, err
		}
	}
	for range 3 {
		resp, err := s.onLease(ctx, ttl, func(id clientv3.LeaseID) (*clientv3.TxnResponse, error) {
			return call(ctx, s.timeout, func(rctx context.Context) (*clientv3.TxnResponse, error) {
				return s.client.Txn(rctx).
					If(clientv3.Compare(clientv3.ModRevision(k), "=", cur.rev)).
					Then(op(id, cur)).
					Else(clientv3.OpGet(k)).
					Commit()
			})
		})
		if err != nil {
			return claim{}, err
		}
		if resp.Succeeded {
			cur.rev = resp.Header.Revision
			return cur, nil
		}
		if cur, err = inProgress(resp.Responses[0].GetResponseRange().Kvs, key, owner, opName); err != nil {
			return claim{}, err
		}
	}
	return claim{}, fmt.Errorf("%w: etcd: the record of %q keeps changing", idempotency.ErrUnavailable, key)
}

// inProgress returns the version of kvs, a read of one record, when owner
// holds it in progress, or ErrNotOwner.
func inProgress(kvs []*mvccpb.KeyValue, key, owner, op string) (claim, error) {
	if len(kvs) == 0 {
		return claim{}, notOwner(op, key)
	}
	kv := kvs[0]
	st, err := decodeRecord(kv.Value)
	if err != nil {
		return claim{}, err
	}
	if st.state != idempotency.StateInProgress || st.owner != owner || kv.Lease == 0 {
		return claim{}, notOwner(op, key)
	}
	return claim{owner: owner, rev: kv.ModRevision, st: st}, nil
}

// lease returns the shared lease of ttl seconds (see Expiry), granting a
// new one when the last is older than leaseReuse. The callers that need it
// while it is granted wait for it, and use it only if it was sent after they
// came or is still younger than leaseReuse once answered (a slow grant must
// not shorten the records of callers that came after it was sent);
// otherwise, or when it failed (its caller's ctx ended, say), they try
// again, granting one themselves.
func (s *Store) lease(ctx context.Context, ttl int64) (clientv3.LeaseID, error) {
	came := time.Now()
	for {
		s.mu.Lock()
		sl := s.leases[ttl]
		if sl != nil {
			select {
			case <-sl.ready:
				if sl.err != nil || time.Since(sl.sent) >= leaseReuse {
					sl = nil
				}
			default:
			}
		}
		if sl == nil {
			// This caller's own grant: its records are counted from its
			// send time, however long the answer takes.
			sl = s.grant(ctx, ttl)
			return sl.id, sl.err
		}
		s.mu.Unlock()
		select {
		case <-sl.ready:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if sl.err == nil && (!sl.sent.Before(came) || time.Since(sl.sent) < leaseReuse) {
			return sl.id, nil
		}
	}
}

// onLease commits txn on the shared lease of ttl seconds (on none when ttl
// is 0). etcd refuses, and applies nothing of, a transaction that puts a
// key on a lease it no longer has: a shared lease cannot run out while
// records still attach to it, but an operator may have revoked it. That
// lease is then forgotten, and txn committed once more, on a new one.
func (s *Store) onLease(ctx context.Context, ttl int64, txn func(clientv3.LeaseID) (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	if ttl == 0 {
		return txn(0)
	}
	for retried := false; ; retried = true {
		id, err := s.lease(ctx, ttl)
		if err != nil {
			return nil, err
		}
		resp, err := txn(id)
		if retried || !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return resp, err
		}
		s.mu.Lock()
		if sl := s.leases[ttl]; sl != nil {
			select {
			case <-sl.ready:
				if sl.id == id {
					delete(s.leases, ttl)
				}
			default: // a new grant, in flight
			}
		}
		s.mu.Unlock()
	}
}

// grant grants a shared lease of ttl seconds and returns it, answered. s.mu
// is held, and released once the grant is in flight.
func (s *Store) grant(ctx context.Context, ttl int64) *sharedLease {
	sl := &sharedLease{ready: make(chan struct{}), sent: time.Now()}
	for t, old := range s.leases {
		select {
		case <-old.ready:
			if time.Since(old.sent) >= leaseReuse {
				delete(s.leases, t)
			}
		default:
		}
	}
	s.leases[ttl] = sl
	s.mu.Unlock()
	g, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return s.client.Grant(rctx, min(ttl+int64(leaseSlack/time.Second), maxLeaseTTL))
	})
	if err == nil {
		sl.id = g.ID
	} else {
		sl.err = err
	}
	close(sl.ready)
	return sl
}

// remember records the store's own claim c of k.
func (s *Store) remember(k string, c claim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims[k] = c
	if len(s.claims) < s.sweepAt {
		return
	}
	now := time.Now()
	for k, c := range s.claims {
		if now.After(c.until) {
			delete(s.claims, k)
		}
	}
	s.sweepAt = max(minSweep, 2*len(s.claims))
}

// remembered returns the store's own claim of k when owner made it.
func (s *Store) remembered(k, owner string) (claim, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.claims[k]
	return c, ok && c.owner == owner
}

// forget drops what the store remembers of a claim of k.
func (s *Store) forget(k string) {
	s.mu.Lock()
	delete(s.claims, k)
	s.mu.Unlock()
}

// withdraw deletes the record under k if it is still v, best effort, even
// when ctx is done: a claim whose put may have landed.
func (s *Store) withdraw(ctx context.Context, k, v string) {
	rctx, cancel := s.timeout.detached(ctx)
	defer cancel()
	_, _ = s.client.Txn(rctx).
		If(clientv3.Compare(clientv3.Value(k), "=", v)).
		Then(clientv3.OpDelete(k)).
		Commit()
}

// call makes one request to etcd, bounded by b, and reports its failure as
// b.err does, but for a refusal for want of rights: no retry outlasts it,
// and an Executor makes any error but an idempotency.ErrInvalid an outage
// (see Store).
func call[T any](ctx context.Context, b bound, f func(rctx context.Context) (T, error)) (T, error) {
	rctx, cancel := b.ctx(ctx)
	defer cancel()
	v, err := f(rctx)
	if denied(err) && ctx.Err() == nil {
		return v, fmt.Errorf("%w: etcd refuses the store's user its records, a setup to mend (grant it read and write on the store's prefix): %w",
			idempotency.ErrInvalid, err)
	}
	return v, b.err(ctx, rctx, err)
}

func notOwner(op, key string) error {
	return fmt.Errorf("%w: %s of %q", idempotency.ErrNotOwner, op, key)
}

// maxLeaseTTL is MaxTTL in seconds; a store's duration beyond it is taken
// as forever rather than refused.
const maxLeaseTTL = int64(MaxTTL / time.Second)

// ttlSeconds rounds d up to whole seconds, the unit of etcd leases, so that a
// lease never ends sooner than asked, by the remainder (d plus a second
// overflows near math.MaxInt64), and at most maxLeaseTTL.
func ttlSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return min(s, maxLeaseTTL)
}

// stored is a record's value.
type stored struct {
	state idempotency.State
	// ttl is the lease TTL, in seconds, the record was last put with, so
	// that Extend to the same duration needs only a keepalive.
	ttl         int64
	fingerprint string
	owner       string
	response    []byte
}

// recordFormat versions the value encoding, so that a later layout can be
// told from this one.
const recordFormat = 1

// encodeRecord lays st out as: format, state, uvarint ttl, uvarint-prefixed
// fingerprint and owner, then the response to the end, so that a 1 MiB
// response costs a few bytes of framing rather than base64's third.
func encodeRecord(st stored) string {
	b := make([]byte, 0, 2+3*binary.MaxVarintLen64+len(st.fingerprint)+len(st.owner)+len(st.response))
	b = idemrecord.AppendHeader(b, recordFormat, st.state)
	b = binary.AppendUvarint(b, uint64(st.ttl))
	b = idemrecord.AppendString(b, st.fingerprint)
	b = idemrecord.AppendString(b, st.owner)
	return string(append(b, st.response...))
}

var errMalformed = fmt.Errorf("%w: etcd: malformed idempotency record", idempotency.ErrUnavailable)

// decodeRecord reverses encodeRecord. A value it cannot read was not written
// by this store (or by a newer format): it is reported as the store being
// unusable rather than as a free key, which would let a second owner in.
func decodeRecord(v []byte) (stored, error) {
	r := idemrecord.NewReader(v, recordFormat)
	st := stored{state: r.State()}
	st.ttl = int64(r.Uvarint())
	st.fingerprint = r.Field()
	st.owner = r.Field()
	st.response = r.Rest()
	if !r.OK() {
		return stored{}, errMalformed
	}
	return st, nil
}

func (st stored) record(scope, key string) *idempotency.Record {
	return &idempotency.Record{
		Scope: scope, Key: key,
		State:       st.state,
		Fingerprint: st.fingerprint,
		Owner:       st.owner,
		Response:    st.response,
	}
}

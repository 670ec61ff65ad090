package etcdlock

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

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
// to an etcd lease of its own, and the lease's TTL, counted by the etcd
// leader, is the record's life: an in-progress record is put with a lease of
// the claim's Lease, a completed one with a new lease of the retention. TTLs
// are whole seconds, so durations are rounded up to the next second, and the
// server raises any TTL below its minimum (2 s with the default 1 s election
// timeout; see MinTTL) to that minimum: a record lives at least as long as
// asked, sometimes a little longer, never shorter.
//
// The leader revokes expired leases on a timer (every 500 ms), so a record
// whose lease ran out stays readable, and blocks Claim, until the revocation
// is applied: typically under a second after the TTL. That lag only delays
// the next owner; it never lets an expired owner go on. Extend and Complete
// first renew the claim's lease with a keepalive, which the leader refuses,
// by its own clock, once the TTL has passed (it waits for the pending
// revocation and answers that the lease is gone), and only then write; an
// expired claim is therefore never revived, whether or not its key has been
// deleted yet. etcd revokes the leases that expire in one tick in parallel, so
// of two claims expiring in the same tick the later one's key may disappear a
// few milliseconds before the earlier one's. A leader change extends every
// lease by up to an election timeout, never shortens one.
//
// # Fencing
//
// Each claim has its own lease, and every change of a record after Claim is
// a transaction that compares the key's mod revision with the one read when
// the owner's token was checked, so a stale owner's write can never land on a
// newer owner's record. The window that remains is between the keepalive that
// proves the claim alive and the transaction that follows it: if the
// transaction were delayed by more than the whole renewed TTL (at least two
// seconds), and applied before the leader revoked the lease, it would land.
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
type Store struct {
	client  *clientv3.Client
	dir     string
	timeout bound
}

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
	return &Store{client: client, dir: c.prefix + "/idem/", timeout: c.timeout}, nil
}

// recordKey is unambiguous because the scope's length comes first, and
// base64url keeps NULs and '/' out of the key so that tools listing the
// prefix see one flat directory.
func (s *Store) recordKey(scope, key string) string {
	b := binary.AppendUvarint(make([]byte, 0, 2+len(scope)+len(key)), uint64(len(scope)))
	b = append(b, scope...)
	b = append(b, key...)
	return s.dir + base64.RawURLEncoding.EncodeToString(b)
}

// Claim implements idempotency.Store. The lease is granted first, then one
// transaction puts the record with it only if the key does not exist, or
// else reads the record in the same revision.
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), c.Check()); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ttl := ttlSeconds(c.Lease)
	g, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return s.client.Grant(rctx, ttl)
	})
	if err != nil {
		return nil, err
	}
	k := s.recordKey(c.Scope, c.Key)
	v := encodeRecord(stored{state: idempotency.StateInProgress, ttl: ttl, fingerprint: c.Fingerprint, owner: c.Owner})
	resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.TxnResponse, error) {
		return s.client.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, v, clientv3.WithLease(g.ID))).
			Else(clientv3.OpGet(k)).
			Commit()
	})
	if err != nil {
		// The put may have landed; revoking takes the claim with it, which
		// is what a caller told the claim failed expects.
		s.revoke(ctx, g.ID)
		return nil, err
	}
	if resp.Succeeded {
		return nil, nil
	}
	s.revoke(ctx, g.ID)
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		// A transaction sees one revision: the key existed for the compare,
		// so the read in the same transaction found it.
		return nil, fmt.Errorf("%w: etcd: record %q vanished inside a transaction", idempotency.ErrUnavailable, c.Key)
	}
	st, err := decodeRecord(kvs[0].Value)
	if err != nil {
		return nil, err
	}
	return st.record(c.Scope, c.Key), nil
}

// Extend implements idempotency.Store. The keepalive is what refuses an
// expired lease; when the record's lease was granted for another duration
// than lease, the record then moves to a new lease of lease, since an etcd
// lease's TTL cannot change.
//
// A keepalive is not part of a transaction, so it runs after the owner check
// and can race with a change of the record: a different owner's claim always
// has a lease of its own, which this keepalive cannot touch, so the race only
// exists with the same owner's own Complete or Abandon, and then renews a
// lease that no longer holds the record (or is revoked, making Extend fail).
func (s *Store) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(lease)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	kv, st, err := s.owned(ctx, k, key, owner, "extend")
	if err != nil {
		return err
	}
	if err := s.keepAlive(ctx, kv, key, "extend"); err != nil {
		return err
	}
	ttl := ttlSeconds(lease)
	if st.ttl == ttl {
		return nil
	}
	st.ttl = ttl
	return s.move(ctx, k, kv, key, st, "extend")
}

// Complete implements idempotency.Store. The keepalive proves the claim still
// alive on the leader's clock; the record then moves, in a transaction
// fenced by its mod revision, to a new lease of the retention, and the
// claim's lease is revoked, so that its TTL no longer bounds the record.
func (s *Store) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(retention), idempotency.CheckResponse(response)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	kv, st, err := s.owned(ctx, k, key, owner, "complete")
	if err != nil {
		return err
	}
	if err := s.keepAlive(ctx, kv, key, "complete"); err != nil {
		return err
	}
	st.state, st.ttl, st.response = idempotency.StateCompleted, ttlSeconds(retention), response
	return s.move(ctx, k, kv, key, st, "complete")
}

// Abandon implements idempotency.Store. An owner may abandon a claim whose
// lease has run out but whose key is not yet deleted: no one else can hold
// it, and deleting it early only frees the key sooner.
func (s *Store) Abandon(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	kv, _, err := s.owned(ctx, k, key, owner, "abandon")
	if err != nil {
		return err
	}
	resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.TxnResponse, error) {
		return s.client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(k)).
			Commit()
	})
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return notOwner("abandon", key)
	}
	s.revoke(ctx, clientv3.LeaseID(kv.Lease))
	return nil
}

// Get implements idempotency.Store.
// Delete implements idempotency.Deleter.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return err
	}
	resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.DeleteResponse, error) {
		return s.client.Delete(rctx, s.recordKey(scope, key))
	})
	if err != nil {
		return err
	}
	if resp.Deleted == 0 {
		return fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
	}
	return nil
}

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

// owned reads the record under k and returns it when owner holds it in
// progress, or ErrNotOwner.
func (s *Store) owned(ctx context.Context, k, key, owner, op string) (*mvccpb.KeyValue, stored, error) {
	if err := ctx.Err(); err != nil {
		return nil, stored{}, err
	}
	resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.GetResponse, error) {
		return s.client.Get(rctx, k)
	})
	if err != nil {
		return nil, stored{}, err
	}
	if len(resp.Kvs) == 0 {
		return nil, stored{}, notOwner(op, key)
	}
	kv := resp.Kvs[0]
	st, err := decodeRecord(kv.Value)
	if err != nil {
		return nil, stored{}, err
	}
	if st.state != idempotency.StateInProgress || st.owner != owner || kv.Lease == 0 {
		return nil, stored{}, notOwner(op, key)
	}
	return kv, st, nil
}

// keepAlive renews the lease kv is attached to. The leader answers that the
// lease is gone once its TTL has passed on its clock, even before the
// revocation has deleted the key.
func (s *Store) keepAlive(ctx context.Context, kv *mvccpb.KeyValue, key, op string) error {
	rctx, cancel := s.timeout.ctx(ctx)
	defer cancel()
	_, err := s.client.KeepAliveOnce(rctx, clientv3.LeaseID(kv.Lease))
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: %s of %q: lease expired", idempotency.ErrNotOwner, op, key)
	case err != nil:
		return s.timeout.err(ctx, rctx, err)
	}
	return nil
}

// move rewrites the record kv as st on a new lease of st.ttl, if kv is still
// the record's current version, then revokes the old lease. The revocation
// can come after the transaction because the put already detached the key
// from the old lease; if it fails, the old lease expires holding nothing.
func (s *Store) move(ctx context.Context, k string, kv *mvccpb.KeyValue, key string, st stored, op string) error {
	g, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return s.client.Grant(rctx, st.ttl)
	})
	if err != nil {
		return err
	}
	resp, err := call(ctx, s.timeout, func(rctx context.Context) (*clientv3.TxnResponse, error) {
		return s.client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)).
			Then(clientv3.OpPut(k, encodeRecord(st), clientv3.WithLease(g.ID))).
			Commit()
	})
	if err != nil {
		// Unknown outcome: the new lease is left to expire rather than
		// revoked, since it may now hold the record.
		return err
	}
	if !resp.Succeeded {
		s.revoke(ctx, g.ID)
		return notOwner(op, key)
	}
	s.revoke(ctx, clientv3.LeaseID(kv.Lease))
	return nil
}

// revoke releases a lease best-effort, even when ctx is done. Failure is not
// reported: the lease expires on its own.
func (s *Store) revoke(ctx context.Context, id clientv3.LeaseID) {
	rctx, cancel := s.timeout.detached(ctx)
	defer cancel()
	_, _ = s.client.Revoke(rctx, id)
}

// call makes one request to etcd, bounded by b, and reports its failure as
// b.err does.
func call[T any](ctx context.Context, b bound, f func(rctx context.Context) (T, error)) (T, error) {
	rctx, cancel := b.ctx(ctx)
	defer cancel()
	v, err := f(rctx)
	return v, b.err(ctx, rctx, err)
}

func notOwner(op, key string) error {
	return fmt.Errorf("%w: %s of %q", idempotency.ErrNotOwner, op, key)
}

// maxLeaseTTL is the longest TTL etcd grants (lease.MaxLeaseTTL, about 285
// years); a duration beyond it is taken as forever rather than refused.
const maxLeaseTTL = 9_000_000_000

// ttlSeconds rounds d up to whole seconds, the unit of etcd leases, so that a
// lease never ends sooner than asked.
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

const (
	stateInProgress byte = 1
	stateCompleted  byte = 2
)

// encodeRecord lays st out as: format, state, uvarint ttl, uvarint-prefixed
// fingerprint and owner, then the response to the end, so that a 1 MiB
// response costs a few bytes of framing rather than base64's third.
func encodeRecord(st stored) string {
	b := make([]byte, 0, 2+3*binary.MaxVarintLen64+len(st.fingerprint)+len(st.owner)+len(st.response))
	b = append(b, recordFormat, stateInProgress)
	if st.state == idempotency.StateCompleted {
		b[1] = stateCompleted
	}
	b = binary.AppendUvarint(b, uint64(st.ttl))
	b = binary.AppendUvarint(b, uint64(len(st.fingerprint)))
	b = append(b, st.fingerprint...)
	b = binary.AppendUvarint(b, uint64(len(st.owner)))
	b = append(b, st.owner...)
	b = append(b, st.response...)
	return string(b)
}

var errMalformed = fmt.Errorf("%w: etcd: malformed idempotency record", idempotency.ErrUnavailable)

// decodeRecord reverses encodeRecord. A value it cannot read was not written
// by this store (or by a newer format): it is reported as the store being
// unusable rather than as a free key, which would let a second owner in.
func decodeRecord(v []byte) (stored, error) {
	if len(v) < 2 || v[0] != recordFormat {
		return stored{}, errMalformed
	}
	var st stored
	switch v[1] {
	case stateInProgress:
		st.state = idempotency.StateInProgress
	case stateCompleted:
		st.state = idempotency.StateCompleted
	default:
		return stored{}, errMalformed
	}
	rest := v[2:]
	ttl, n := binary.Uvarint(rest)
	if n <= 0 {
		return stored{}, errMalformed
	}
	st.ttl, rest = int64(ttl), rest[n:]
	field := func() (string, bool) {
		l, n := binary.Uvarint(rest)
		if n <= 0 || l > uint64(len(rest)-n) {
			return "", false
		}
		f := string(rest[n : n+int(l)])
		rest = rest[n+int(l):]
		return f, true
	}
	var ok bool
	if st.fingerprint, ok = field(); !ok {
		return stored{}, errMalformed
	}
	if st.owner, ok = field(); !ok {
		return stored{}, errMalformed
	}
	if len(rest) > 0 {
		st.response = append([]byte(nil), rest...)
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

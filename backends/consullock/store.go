package consullock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/backends/internal/idemrecord"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// DefaultStorePrefix is the Consul KV prefix of the idempotency records
// unless WithStorePrefix says otherwise.
const DefaultStorePrefix = "warden/idem/"

// Store is an idempotency.Store on Consul KV. It is safe for concurrent use;
// Close it when done.
//
// # Claims and their leases
//
// Consul KV has no TTL on keys and exposes no clock a transaction could
// compare a deadline with, so a claim's lease is kept by the Store that made
// it, on its process's monotonic clock, with a Consul session as the
// backstop. Each Store has one session (the same kind as a Locker's: a TTL,
// Behavior "delete", no health checks, no lock-delay), renewed every third
// of its TTL, and a claim is a key acquired by that session in one
// transaction that checks the key does not exist. The Store then counts the
// claim's lease from the moment it sent the claim, and when the lease runs
// out without an Extend it deletes the key itself (a transaction that checks
// the claim's ModifyIndex, so a record that changed since is never
// touched). A process that crashes or is cut off stops renewing the session:
// Consul deletes every claim the session holds between one and two session
// TTLs after the last renewal (see WithStoreSessionTTL), so a crashed
// owner's claims become claimable again then, however long their leases.
// A Store cut off from Consul gives its session up a tenth of the TTL
// before Consul could end it, and tells an idempotency.Executor then
// (ClaimDone), which stops the claims' work at once rather than at its next
// renewal, a third of a lease later, by when the key may be claimed again.
//
// Extend and Complete must therefore come through the Store that made the
// claim (in practice, the process that drew the owner token, as
// idempotency.Executor and httpmw do): only it knows the lease's deadline.
// Either refuses with idempotency.ErrNotOwner once that deadline has passed,
// before any request, so an expired claim is never revived, and otherwise
// checks the claim's ModifyIndex on the server in the same transaction as
// its write: a claim deleted by an operator, by its expiry, or by the
// session's end, or claimed anew since, is never written to. A stale
// claimant can thus never overwrite a completed record: completing is a
// compare-and-set on the ModifyIndex of its own claim, which the completed
// record no longer has. Abandon, which only frees a key sooner, is accepted
// from any Store given the owner token.
//
// # Retention
//
// A completed record is released from the session, so that it outlives the
// process that wrote it, and keeps its deadline: the completing process's
// wall clock (Unix time) at Complete plus the retention. Whoever reads the
// record compares the deadline with its own wall clock, so the retention is
// measured by the application hosts' clocks, the one place this store
// depends on them: hosts whose clocks disagree by d see the record expire up
// to d early or late. Nothing else depends on it: an expired record is taken
// over only by a compare-and-set on the ModifyIndex that was read, so two
// claimants never both take it.
//
// Consul never deletes a completed record by itself. An expired one is
// reclaimed by the next Claim of its key, which overwrites it in place, and
// Purge deletes the expired records no one claimed again: run it
// periodically where keys are not reused (most idempotency keys are not).
//
// # Round trips
//
// A first request costs 2 requests: the Claim, one transaction
// (check that the record does not exist, lock it by the session, read back
// its ModifyIndex), and the Complete, another. A Claim that finds the record
// taken (a replay, or the poll of a duplicate waiting for a claim in
// progress) costs 1 when this Store expects the record: one consistent
// read-only transaction returns it whole, chunks included.
//
// Consul cannot answer both in one request. A transaction that fails a
// check is rolled back and returns no reads, and every conditional write
// (lock, cas, the checks) fails the whole transaction when its condition
// does not hold, so the claim transaction cannot also read a taken record
// back; and a read before every claim would cost each first request a
// third. So a Store reads first only the keys it expects to be taken: the
// last 4,096 or so it claimed or found taken, by hash, which is where the
// replays of its own answers and the polls of a waiting Executor land. Any
// other key it claims first, and a replay that lands there costs 2 (the
// failed claim, then the read); an expected record that is gone costs one
// request more than a claim. A failed claim is also a Raft write, which the
// read is not. Extend is one read-only transaction. The first Claim of a
// Store also creates its session (one request), and the session's renewal
// costs one request per third of its TTL for all claims together.
//
// # Layout and size
//
// The record of (scope, key) is the key <prefix><base64url of the scope's
// length as a uvarint, the scope and the key>, so no two pairs share a key
// and any bytes are allowed. Its value is a small binary encoding of the
// state, the fingerprint, the owner, the retention deadline and the
// response. Consul refuses values and transactions over 512 KiB by default
// (kv_max_value_size, txn_max_req_len), so a response longer than
// inlineResponse (256 KiB) is written first in chunks under <record key>/,
// each a KV put of its own, and the transaction that completes the record
// then names them: a response of idempotency.MaxResponseLen (1 MiB) costs 3
// more requests to write and none more to read. Chunks left behind by a
// Complete that failed are deleted by the next Claim, Abandon or Delete of
// the key, and by Purge.
//
// # Failures
//
// Every request is bounded by the request timeout (WithStoreRequestTimeout):
// one that gets no answer in time fails with an error wrapping
// idempotency.ErrUnavailable, while the caller's own cancellation is
// reported as ctx's error. A request Consul refuses for want of ACL rights
// fails at once, with Consul's reason (the record's path taken out), never
// as a record taken or not owned, and wraps idempotency.ErrInvalid, not
// ErrUnavailable: an Executor passes it on rather than as an outage, so
// that httpmw's WithFailOpen does not serve keyed requests unguarded until
// someone mends the token's rules. A token Consul does not know (403 "ACL
// not found") stays ErrUnavailable: the next request may carry a new one.
// A Claim whose outcome is unknown (no answer) is deleted again by the
// Store as soon as Consul answers, since its caller was told that it
// failed.
type Store struct {
	client  *api.Client
	dir     string
	timeout time.Duration
	ttl     time.Duration
	// sessions keeps the Store's session; it holds no locks.
	sessions *Locker

	// seen[h%expectSlots] is h, the hash of a record key under seed, when
	// this Store claimed that record or found it taken, last of the keys
	// whose hashes share the slot: Claim reads such a key first (see Round
	// trips). A stale or lost entry costs a request, never a wrong answer.
	seed maphash.Seed
	seen [expectSlots]atomic.Uint64

	mu     sync.Mutex
	claims map[string]*claim // by record key: the claims this Store made
	closed bool
	wg     sync.WaitGroup // expiries running
}

var (
	_ idempotency.Store   = (*Store)(nil)
	_ idempotency.Deleter = (*Store)(nil)
)

// StoreOption configures a Store.
type StoreOption func(*storeConfig) error

type storeConfig struct {
	prefix  string
	timeout time.Duration
	ttl     time.Duration
}

// WithStorePrefix puts the records under prefix (a trailing '/' is implied),
// so that stores meant to share records use the same prefix and other
// applications' keys stay apart. Default DefaultStorePrefix.
//
// The prefix's elements between '/' must not be empty, "." or "..": the
// Store reaches some keys by their path in a URL (reads, chunks, Purge's
// listing) and others inside transactions, and Consul's HTTP server cleans
// a path before it serves it, so a prefix such as "a/../b", "a//b" or
// "/a" would put a record's chunks, and Purge's listing, under other keys
// than its record.
func WithStorePrefix(prefix string) StoreOption {
	return func(c *storeConfig) error {
		p := strings.TrimSuffix(prefix, "/")
		if p == "" {
			return fmt.Errorf("%w: empty consul store prefix", driver.ErrInvalidOption)
		}
		for e := range strings.SplitSeq(p, "/") {
			if e == "" || e == "." || e == ".." {
				return fmt.Errorf("%w: consul store prefix %q has an element %q, which an HTTP path does not keep", driver.ErrInvalidOption, prefix, e)
			}
		}
		p += "/"
		if strings.HasPrefix(RevokedPrefix, p) || strings.HasPrefix(p, RevokedPrefix) {
			// Purge would take the sessions' markers for records.
			return fmt.Errorf("%w: consul store prefix %q overlaps the sessions' %q", driver.ErrInvalidOption, prefix, RevokedPrefix)
		}
		c.prefix = p
		return nil
	}
}

// WithStoreRequestTimeout bounds each request the Store makes to Consul; d
// must be positive. Default DefaultRequestTimeout.
func WithStoreRequestTimeout(d time.Duration) StoreOption {
	return func(c *storeConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: consul store request timeout %v is not positive", driver.ErrInvalidOption, d)
		}
		c.timeout = d
		return nil
	}
}

// WithStoreSessionTTL sets the TTL of the Store's session, between MinTTL
// and MaxTTL (default MinTTL). It bounds how long the claims of a process
// that crashed, or was cut off from Consul, block their keys: between one
// and two TTLs after the session's last renewal. A longer TTL costs fewer
// renewals and lets a claim survive a longer outage of Consul.
func WithStoreSessionTTL(d time.Duration) StoreOption {
	return func(c *storeConfig) error {
		if d < MinTTL || d > MaxTTL {
			return fmt.Errorf("%w: consul store session TTL %v outside [%v, %v]", driver.ErrInvalidOption, d, MinTTL, MaxTTL)
		}
		c.ttl = d
		return nil
	}
}

// NewStore returns a store that keeps its records in the Consul datacenter
// client talks to. The client stays the caller's. No request is made until
// the first call; the first Claim creates the Store's session, which Close
// destroys.
func NewStore(client *api.Client, opts ...StoreOption) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil consul client", driver.ErrInvalidOption)
	}
	c := storeConfig{prefix: DefaultStorePrefix, timeout: DefaultRequestTimeout, ttl: MinTTL}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", driver.ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	l, err := New(client, WithRequestTimeout(c.timeout))
	if err != nil {
		return nil, err
	}
	// The Store's session holds no lock for ForceRelease to take, so its
	// token needs no write on RevokedPrefix.
	l.anchorOptional = true
	return &Store{
		client: client, dir: c.prefix, timeout: c.timeout, ttl: c.ttl,
		sessions: l,
		seed:     maphash.MakeSeed(),
		claims:   make(map[string]*claim),
	}, nil
}

// Close stops the Store's expiries and destroys its session, which deletes
// every claim it still holds (completed records stay). Later calls fail
// with an error wrapping idempotency.ErrUnavailable.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	for k, c := range s.claims {
		c.timer.Stop()
		delete(s.claims, k)
	}
	s.mu.Unlock()
	err := s.sessions.Close()
	s.wg.Wait()
	return err
}

// claim is a claim this Store made, still in progress as far as it knows.
type claim struct {
	key, owner, fingerprint string
	s                       *session
	// index is the record's ModifyIndex as claimed; 0 while unknown (the
	// claim request got no answer).
	index uint64
	// Guarded by Store.mu: the lease's end on this process's monotonic
	// clock, and whether it has passed (the claim is being deleted).
	deadline time.Time
	expired  bool
	timer    *time.Timer
}

// recordKey is idemrecord.Key under the Store's prefix: no '/' or '.'
// follows the prefix, so that a record is never mistaken for a lock's key
// and its chunks, under <record key>/, belong to it alone.
func (s *Store) recordKey(scope, key string) string {
	return idemrecord.Key(s.dir, scope, key)
}

// expectSlots is the number of record keys a Store remembers having seen
// taken (32 KiB of hashes): replays and polls of an in-progress key come
// soon after the claim, and a key that fell out costs one request more.
const expectSlots = 1 << 12

func (s *Store) expectSlot(k string) (*atomic.Uint64, uint64) {
	h := maphash.String(s.seed, k) | 1 // never 0, an empty slot
	return &s.seen[h%expectSlots], h
}

// expect notes that record k exists: this Store claimed it or found it
// taken.
func (s *Store) expect(k string) {
	p, h := s.expectSlot(k)
	p.Store(h)
}

// expected reports whether this Store expects record k to exist.
func (s *Store) expected(k string) bool {
	p, h := s.expectSlot(k)
	return p.Load() == h
}

// unexpect forgets k once this Store has deleted its record.
func (s *Store) unexpect(k string) {
	p, h := s.expectSlot(k)
	p.CompareAndSwap(h, 0)
}

// Claim implements idempotency.Store. It starts with the claim transaction,
// or with a read of the record when this Store expects one (see Round
// trips); either way it claims only a key it has seen free or expired.
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (_ *idempotency.Record, err error) {
	defer refusedForGood(&err)
	if err := errors.Join(idempotency.CheckContext(ctx), c.Check()); err != nil {
		return nil, err
	}
	k := s.recordKey(c.Scope, c.Key)
	value := encodeRecord(stored{state: idempotency.StateInProgress, fingerprint: c.Fingerprint, owner: c.Owner})
	var free uint64 // 0: the key is believed absent
	readFirst := s.expected(k)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !readFirst {
			claimed, err := s.claim(ctx, k, free, value, c)
			if err != nil || claimed {
				return nil, err
			}
		}
		readFirst = false
		kv, st, err := s.load(ctx, k)
		if err != nil {
			return nil, err
		}
		switch {
		case kv == nil:
			free = 0 // deleted in between
		case st.expired(kv, time.Now()):
			free = kv.ModifyIndex
		default:
			s.expect(k)
			return st.record(c.Scope, c.Key), nil
		}
	}
}

// claim sends the claim transaction of c, under k, with value: it checks
// that the record is absent (free 0) or still at ModifyIndex free, locks it
// by the Store's session, deletes any chunks left under it, and reads back
// its ModifyIndex. It reports false, and no error, when the check failed.
func (s *Store) claim(ctx context.Context, k string, free uint64, value []byte, c idempotency.Claim) (bool, error) {
	for {
		sess, err := s.session(ctx)
		if err != nil {
			return false, err
		}
		check := &api.KVTxnOp{Verb: api.KVCheckNotExists, Key: k}
		if free != 0 {
			check = &api.KVTxnOp{Verb: api.KVCheckIndex, Key: k, Index: free}
		}
		sent := time.Now()
		ok, resp, err := s.txn(ctx, true, api.KVTxnOps{
			check,
			{Verb: api.KVLock, Key: k, Value: value, Session: sess.id},
			{Verb: api.KVDeleteTree, Key: k + "/"},
			{Verb: api.KVGet, Key: k},
		})
		if err != nil {
			// The claim may have landed: it is taken back as soon as
			// Consul answers, since the caller is told it failed. A
			// refusal (as for want of rights) is an answer: nothing landed,
			// and a token that cannot write the record may not read it
			// either, which would have the taking back tried until the
			// Store closed.
			if !errors.Is(err, errRefused) {
				s.track(&claim{key: k, owner: c.Owner, fingerprint: c.Fingerprint, s: sess}, time.Time{})
			}
			return false, err
		}
		if ok {
			var index uint64
			for _, kv := range resp.Results {
				if kv.Key == k {
					index = kv.ModifyIndex
				}
			}
			s.track(&claim{key: k, owner: c.Owner, fingerprint: c.Fingerprint, s: sess, index: index}, sent.Add(c.Lease))
			s.expect(k)
			return true, nil
		}
		if checkFailed(resp) {
			return false, nil
		}
		// The check passed and the lock verb failed: the session ended in
		// between, which the Locker finds out within a round trip.
		if err := driver.Sleep(ctx, retryDelay, nil); err != nil {
			return false, err
		}
	}
}

var _ idempotency.ClaimWatcher = (*Store)(nil)

// ClaimDone implements idempotency.ClaimWatcher: the channel closes when
// the session that holds owner's claim is lost, a tenth of its TTL before
// Consul could delete the claim with it, which it does whatever the
// claim's lease (see WithStoreSessionTTL). The Executor then stops the
// claim's work at once, not at its next renewal, up to a third of the lease
// later.
func (s *Store) ClaimDone(scope, key, owner string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims[s.recordKey(scope, key)]
	if c == nil || c.owner != owner {
		done := make(chan struct{})
		close(done)
		return done
	}
	return c.s.Done()
}

// Extend implements idempotency.Store: one read-only transaction checks
// that the claim is still the record, then the lease runs for lease from
// when it was sent.
func (s *Store) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) (err error) {
	defer refusedForGood(&err)
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(lease)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	c, err := s.live(k, owner, "extend")
	if err != nil {
		return err
	}
	sent := time.Now()
	ok, _, err := s.txn(ctx, false, api.KVTxnOps{{Verb: api.KVCheckIndex, Key: k, Index: c.index}})
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok {
		s.forget(c)
		return notOwner("extend", key)
	}
	if s.claims[k] != c || c.expired || !time.Now().Before(c.deadline) || c.s.lost() {
		return fmt.Errorf("%w: extend of %q: lease expired", idempotency.ErrNotOwner, key)
	}
	c.deadline = sent.Add(lease)
	c.timer.Reset(time.Until(c.deadline))
	return nil
}

// Complete implements idempotency.Store: one transaction checks that the
// claim is still the record and releases it from the session with the
// completed value.
func (s *Store) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) (err error) {
	defer refusedForGood(&err)
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(retention), idempotency.CheckResponse(response)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	c, err := s.live(k, owner, "complete")
	if err != nil {
		return err
	}
	st := stored{state: idempotency.StateCompleted, fingerprint: c.fingerprint, owner: owner, expires: unixAfter(time.Now(), retention)}
	var chunkDir string
	if len(response) > inlineResponse {
		chunkDir = k + "/" + strconv.FormatUint(c.index, 10) + "/"
		if err := s.hidePath(s.putChunks(ctx, chunkDir, response), k); err != nil {
			s.dropChunks(ctx, chunkDir)
			return err
		}
		st.chunks = uint64((len(response) + chunkSize - 1) / chunkSize)
		st.chunkIndex = c.index
	} else {
		st.response = response
	}
	ok, _, err := s.txn(ctx, true, api.KVTxnOps{
		{Verb: api.KVCheckIndex, Key: k, Index: c.index},
		{Verb: api.KVUnlock, Key: k, Value: encodeRecord(st), Session: c.s.id},
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.forget(c)
	s.mu.Unlock()
	if !ok {
		if chunkDir != "" {
			s.dropChunks(ctx, chunkDir)
		}
		return notOwner("complete", key)
	}
	return nil
}

// Abandon implements idempotency.Store. An owner may abandon from any Store:
// deleting its claim only frees the key sooner.
func (s *Store) Abandon(ctx context.Context, scope, key, owner string) (err error) {
	defer refusedForGood(&err)
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	var index uint64
	s.mu.Lock()
	if c := s.claims[k]; c != nil && c.owner == owner && !c.expired && c.index != 0 {
		index = c.index
	}
	s.mu.Unlock()
	if index == 0 {
		kv, st, err := s.read(ctx, k)
		if err != nil {
			return driver.NotSent(err) // a read's, before the delete
		}
		if kv == nil || st.state != idempotency.StateInProgress || st.owner != owner {
			return notOwner("abandon", key)
		}
		index = kv.ModifyIndex
	}
	ok, _, err := s.txn(ctx, false, deleteRecord(k, index))
	if err != nil {
		return notSentOr(err)
	}
	s.mu.Lock()
	if c := s.claims[k]; c != nil && c.owner == owner {
		s.forget(c)
	}
	s.mu.Unlock()
	if !ok {
		return notOwner("abandon", key)
	}
	s.unexpect(k)
	return nil
}

// Get implements idempotency.Store, in one request, chunks included.
func (s *Store) Get(ctx context.Context, scope, key string) (_ *idempotency.Record, err error) {
	defer refusedForGood(&err)
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return nil, err
	}
	kv, st, err := s.load(ctx, s.recordKey(scope, key))
	if err != nil {
		return nil, err
	}
	if kv == nil || st.expired(kv, time.Now()) {
		return nil, fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
	}
	return st.record(scope, key), nil
}

// Delete implements idempotency.Deleter, in one transaction: reading the
// record fails it when there is none. A delete naming an owner reads the
// record first and is fenced by the index it read, read again when the
// record changed meanwhile, a few times at most.
func (s *Store) Delete(ctx context.Context, scope, key, owner string) (err error) {
	defer refusedForGood(&err)
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return err
	}
	k := s.recordKey(scope, key)
	read := api.KVTxnOp{Verb: api.KVGet, Key: k}
	for range 3 {
		if owner != "" {
			ok, resp, err := s.txn(ctx, false, api.KVTxnOps{{Verb: api.KVGetOrEmpty, Key: k}})
			if err != nil {
				// A read's: the deletes sent before it failed their
				// check, and applied nothing.
				return driver.NotSent(err)
			}
			if ok && len(resp.Results) == 0 {
				// Get-or-empty answers even when there is no record:
				// Consul left out a record the token may not read.
				return driver.NotSent(fmt.Errorf("%w: consul left the record out of its read", errDenied))
			}
			if !ok || resp.Results[0].ModifyIndex == 0 {
				return fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
			}
			st, err := decodeRecord(resp.Results[0].Value)
			if err != nil {
				return err
			}
			if st.owner != owner {
				return notOwner("delete", key)
			}
			read = api.KVTxnOp{Verb: api.KVCheckIndex, Key: k, Index: resp.Results[0].ModifyIndex}
		}
		ok, _, err := s.txn(ctx, false, api.KVTxnOps{
			&read,
			{Verb: api.KVDelete, Key: k},
			{Verb: api.KVDeleteTree, Key: k + "/"},
		})
		if err != nil {
			return notSentOr(err)
		}
		switch {
		case ok:
			s.unexpect(k)
			return nil
		case owner == "":
			return fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
		}
	}
	return fmt.Errorf("%w: consul delete: the record kept changing", idempotency.ErrUnavailable)
}

// Purge deletes the completed records whose retention has run out on this
// host's clock, and the chunks no record names, and returns how many
// records it deleted. Consul deletes nothing by itself: without Purge, a
// key never claimed again keeps its record. Purge lists the prefix's keys
// in one request and reads each record with one more, so run it
// periodically, from one process, at a pace the number of records allows.
// Its token must read every key under the prefix: a listing from which
// Consul's ACL left keys out fails, with nothing deleted.
func (s *Store) Purge(ctx context.Context) (_ int, err error) {
	defer refusedForGood(&err)
	if err := idempotency.CheckContext(ctx); err != nil {
		return 0, err
	}
	// A record the ACL left out of the listing would leave its chunks
	// looking like no record's, and deleted: the listing carries the
	// token such reads do (see readToken).
	var keys []string
	hiddenFrom, err := s.sessions.whole(ctx, func(secret string) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		q := queryOpts(rctx)
		q.Token = secret
		ks, meta, err := s.client.KV().Keys(s.dir, "", q)
		if err = s.sessions.fail(ctx, rctx, err); err != nil {
			return false, err
		}
		keys = ks
		return meta.ResultsFilteredByACLs, nil
	})
	switch {
	case err != nil:
		return 0, err
	case hiddenFrom != "":
		return 0, fmt.Errorf("%w: consul left out of its listing of %q keys that %s may not read", errDenied, s.dir, hiddenFrom)
	}
	records := make(map[string]bool)
	for _, k := range keys {
		if !strings.Contains(k[len(s.dir):], "/") {
			records[k] = true
		}
	}
	purged := 0
	for _, k := range keys {
		rest := k[len(s.dir):]
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			// A chunk, <record>/<index>/<number>, is kept while its
			// record is, since a Complete in flight writes its chunks
			// before the record names them. Other keys are not the
			// Store's.
			record := s.dir + rest[:i]
			if !records[record] && isChunk(rest[i+1:]) {
				s.dropChunks(ctx, record+"/")
				records[record] = true // once
			}
			continue
		}
		kv, st, err := s.read(ctx, k)
		if err != nil {
			return purged, err
		}
		if kv == nil || !st.expired(kv, time.Now()) {
			continue
		}
		ok, _, err := s.txn(ctx, false, deleteRecord(k, kv.ModifyIndex))
		if err != nil {
			return purged, err
		}
		if ok {
			s.unexpect(k)
			purged++
		}
	}
	return purged, nil
}

// Ping asks the agent for the datacenter's leader, as Locker.Ping does:
// the store needs one to answer. It is bounded by ctx and the request
// timeout.
func (s *Store) Ping(ctx context.Context) error {
	if err := idempotency.CheckContext(ctx); err != nil {
		return err
	}
	return s.sessions.Ping(ctx)
}

// isChunk reports whether rest, what follows a record key and '/', names a
// chunk: <decimal index>/<decimal number>.
func isChunk(rest string) bool {
	index, number, ok := strings.Cut(rest, "/")
	_, err1 := strconv.ParseUint(index, 10, 64)
	_, err2 := strconv.ParseUint(number, 10, 64)
	return ok && err1 == nil && err2 == nil
}

// errStoreClosed is what a call on a closed Store returns.
var errStoreClosed = fmt.Errorf("%w: consul store closed", idempotency.ErrUnavailable)

// session returns the Store's live session, creating one when there is none
// or the last one ended.
func (s *Store) session(ctx context.Context) (*session, error) {
	sess, err := s.sessions.session(ctx, s.ttl)
	if errors.Is(err, errClosed) {
		return nil, errStoreClosed
	}
	return sess, err
}

// track registers c, just claimed, with its lease ending at end; a zero end
// (the claim's outcome unknown) has it deleted at once.
func (s *Store) track(c *claim, end time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return // the session is destroyed, and the claim with it
	}
	if old := s.claims[c.key]; old != nil {
		old.timer.Stop()
	}
	s.claims[c.key] = c
	c.deadline = end
	c.timer = time.AfterFunc(time.Until(end), func() { s.expire(c) })
}

// live returns the claim of k if it is owner's and its lease has not run
// out, or ErrNotOwner.
func (s *Store) live(k, owner, op string) (*claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims[k]
	switch {
	case c == nil || c.owner != owner:
		return nil, fmt.Errorf("%w: %s: no claim of this owner made by this store", idempotency.ErrNotOwner, op)
	case c.expired || c.index == 0 || !time.Now().Before(c.deadline):
		return nil, fmt.Errorf("%w: %s: lease expired", idempotency.ErrNotOwner, op)
	case c.s.lost():
		return nil, fmt.Errorf("%w: %s: consul session lost, and the claim with it", idempotency.ErrNotOwner, op)
	}
	return c, nil
}

// forget drops c; s.mu is held.
func (s *Store) forget(c *claim) {
	if s.claims[c.key] == c {
		c.timer.Stop()
		delete(s.claims, c.key)
	}
}

// expire runs when c's lease may have run out: unless an Extend moved the
// deadline, the claim is marked expired and its record deleted, if it is
// still c's.
func (s *Store) expire(c *claim) {
	s.mu.Lock()
	if s.claims[c.key] != c || c.expired {
		s.mu.Unlock()
		return
	}
	if wait := time.Until(c.deadline); wait > 0 {
		c.timer.Reset(wait)
		s.mu.Unlock()
		return
	}
	c.expired = true
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	s.reclaim(c)
	s.mu.Lock()
	s.forget(c)
	s.mu.Unlock()
}

// reclaim deletes c's record if it is still c's claim, trying again while
// Consul cannot be reached, until the session ends (Consul then deletes the
// claim itself) or the Store is closed.
func (s *Store) reclaim(c *claim) {
	pause := driver.Backoff{Min: retryDelay, Max: time.Second}
	ctx := c.s.ctx // cancelled when the session ends or is closed
	for !c.s.lost() {
		index := c.index
		err := func() error {
			if index == 0 {
				kv, st, err := s.read(ctx, c.key)
				if err != nil || kv == nil || kv.Session != c.s.id || st.state != idempotency.StateInProgress || st.owner != c.owner {
					return err
				}
				index = kv.ModifyIndex
			}
			ok, _, err := s.txn(ctx, false, deleteRecord(c.key, index))
			if ok {
				s.unexpect(c.key)
			}
			return err
		}()
		if err == nil || driver.Sleep(ctx, pause.Next(), c.s.done) != nil {
			return
		}
	}
}

// checkFailed reports whether the transaction resp was refused by its first
// op, the check of the record's state.
func checkFailed(resp *api.KVTxnResponse) bool {
	for _, e := range resp.Errors {
		if e.OpIndex == 0 {
			return true
		}
	}
	return false
}

// deleteRecord is the transaction that deletes record k, with its chunks,
// if its ModifyIndex is still index. Not delete-cas, which Consul reports
// as a success when the key is gone.
func deleteRecord(k string, index uint64) api.KVTxnOps {
	return api.KVTxnOps{
		{Verb: api.KVCheckIndex, Key: k, Index: index},
		{Verb: api.KVDelete, Key: k},
		{Verb: api.KVDeleteTree, Key: k + "/"},
	}
}

// read reads record k with a consistent read; a nil pair means none.
func (s *Store) read(ctx context.Context, k string) (*api.KVPair, stored, error) {
	if err := ctx.Err(); err != nil {
		return nil, stored{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	kv, _, err := s.client.KV().Get(k, queryOpts(rctx))
	if err != nil {
		return nil, stored{}, s.hidePath(s.unavailable(ctx, rctx, err), k)
	}
	if kv == nil {
		return nil, stored{}, nil
	}
	st, err := decodeRecord(kv.Value)
	if err != nil {
		return nil, stored{}, err
	}
	return kv, st, nil
}

// load reads record k and the chunks under it in one consistent read-only
// transaction (get-or-empty, Consul 1.14 or later, does not fail it when
// there is no record), so that a completed record comes back whole,
// however long its response; a nil pair means none.
func (s *Store) load(ctx context.Context, k string) (*api.KVPair, stored, error) {
	ok, resp, err := s.txn(ctx, false, api.KVTxnOps{
		{Verb: api.KVGetOrEmpty, Key: k},
		{Verb: api.KVGetTree, Key: k + "/"},
	})
	if err != nil {
		return nil, stored{}, err
	}
	if !ok || len(resp.Results) == 0 || resp.Results[0].Key != k {
		// An ACL that denies the read, or a server older than 1.14:
		// neither passes (see Store).
		var why []string
		for _, e := range resp.Errors {
			why = append(why, e.What)
		}
		return nil, stored{}, s.hidePath(fmt.Errorf("%w: consul: read of the record refused, a setup to mend (the store's token needs read and write on its prefix, and Consul 1.14 or later): %s",
			idempotency.ErrInvalid, strings.Join(why, "; ")), k)
	}
	kv := resp.Results[0]
	if kv.ModifyIndex == 0 {
		return nil, stored{}, nil // get-or-empty's empty answer
	}
	st, err := decodeRecord(kv.Value)
	if err != nil || st.chunks == 0 {
		return kv, st, err
	}
	// Chunk names are fixed-width, so Consul lists them in order; a chunk
	// directory other than the record's is a failed Complete's leftover.
	dir := k + "/" + strconv.FormatUint(st.chunkIndex, 10) + "/"
	var n uint64
	for _, p := range resp.Results[1:] {
		if strings.HasPrefix(p.Key, dir) {
			st.response = append(st.response, p.Value...)
			n++
		}
	}
	if n != st.chunks {
		return nil, stored{}, fmt.Errorf("%w: %d of its %d chunks", errMalformed, n, st.chunks)
	}
	return kv, st, nil
}

// Consul's default limit on a value and on a transaction's body is 512 KiB,
// and a transaction carries values in base64: a response up to
// inlineResponse goes inside the record, a longer one in chunks of
// chunkSize, each its own put of the raw bytes.
const (
	inlineResponse = 256 << 10
	chunkSize      = 448 << 10
)

// putChunks writes response in chunks under dir, one put each.
func (s *Store) putChunks(ctx context.Context, dir string, response []byte) error {
	for i := 0; i*chunkSize < len(response); i++ {
		part := response[i*chunkSize : min((i+1)*chunkSize, len(response))]
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		_, err := s.client.KV().Put(&api.KVPair{Key: fmt.Sprintf("%s%04d", dir, i), Value: part}, writeOpts(rctx))
		err = s.unavailable(ctx, rctx, err)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// dropChunks deletes the chunks under dir, best effort, even when ctx is
// done: the next claim of the key, or Purge, deletes them otherwise.
func (s *Store) dropChunks(ctx context.Context, dir string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	_, _ = s.client.KV().DeleteTree(dir, writeOpts(rctx))
}

// txn runs ops, on one record (ops[0]'s key) and the keys under it, in one
// transaction and reports whether Consul applied it; a refusal for want of
// ACL rights is an error. A write (detached) runs to completion even when
// ctx is cancelled, since a request cancelled in flight may be applied all
// the same; ctx's error is then returned after it.
func (s *Store) txn(ctx context.Context, detached bool, ops api.KVTxnOps) (bool, *api.KVTxnResponse, error) {
	if err := ctx.Err(); err != nil {
		return false, nil, err
	}
	base := ctx
	if detached {
		base = context.WithoutCancel(ctx)
	}
	rctx, cancel := context.WithTimeout(base, s.timeout)
	defer cancel()
	ok, resp, err := txn(rctx, s.client, ops)
	if err != nil {
		return false, nil, s.unavailable(ctx, rctx, err)
	}
	if !ok {
		// Refused for want of ACL rights, it would be refused again: an
		// error, not a check that failed (a record taken or changed).
		// Consul names the key it refused, which is the record's or
		// under it.
		if err := denied(resp); err != nil {
			return false, nil, s.hidePath(err, ops[0].Key)
		}
	}
	return ok, resp, nil
}

// hidePath takes the path of record k out of err's text, where the
// client's errors give it (the URL of a request, an ACL's denial): its
// base64 is the scope and the key, which the idempotency package shows
// only as their hash (idempotency.KeyHash). errors.Is and errors.As still
// reach the error.
func (s *Store) hidePath(err error, k string) error {
	if err == nil {
		return nil
	}
	enc := strings.TrimPrefix(k, s.dir)
	msg := err.Error()
	if enc == "" || !strings.Contains(msg, enc) {
		return err
	}
	return &pathHidden{err: err, msg: strings.ReplaceAll(msg, enc, "<record>")}
}

// pathHidden is an error whose text hidePath rewrote.
type pathHidden struct {
	err error
	msg string
}

func (e *pathHidden) Error() string { return e.msg }
func (e *pathHidden) Unwrap() error { return e.err }

// unavailable reports the failure of a request made on rctx for a caller
// whose context is ctx, as the Locker does.
func (s *Store) unavailable(ctx, rctx context.Context, err error) error {
	return s.sessions.fail(ctx, rctx, err)
}

// refusedForGood makes *err, the failure of a Store call, an
// idempotency.ErrInvalid when Consul refused it for want of ACL rights
// (errDenied, which wraps ErrUnavailable for the Locker's callers): no
// retry outlasts that, and an Executor makes any error but an ErrInvalid
// an outage (see Store). Consul's words, and a driver.NotSent mark, are
// kept.
func refusedForGood(err *error) {
	e := *err
	if !errors.Is(e, errDenied) || unknownToken(e) {
		return
	}
	msg := strings.Replace(e.Error(), errDenied.Error(),
		"consul refused the store's request for want of ACL rights, a setup to mend (its token needs write on the store's prefix and session:write)", 1)
	*err = fmt.Errorf("%w: %s", idempotency.ErrInvalid, msg)
	if errors.Is(e, driver.ErrNotSent) {
		*err = driver.NotSent(*err)
	}
}

func notOwner(op, key string) error {
	return fmt.Errorf("%w: %s of %q", idempotency.ErrNotOwner, op, key)
}

// unixAfter is the Unix time in nanoseconds d after now, saturated rather
// than overflowing.
func unixAfter(now time.Time, d time.Duration) int64 {
	n := now.UnixNano()
	if n > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return n + int64(d)
}

// stored is a record's value.
type stored struct {
	state       idempotency.State
	fingerprint string
	owner       string
	// Set once completed: the retention's end, Unix nanoseconds on the
	// completing host's clock, and the response, inline or in chunks
	// chunks under <record key>/<chunkIndex>/.
	expires    int64
	chunks     uint64
	chunkIndex uint64
	response   []byte
}

// record returns st as the record of (scope, key).
func (st stored) record(scope, key string) *idempotency.Record {
	return &idempotency.Record{
		Scope: scope, Key: key,
		State:       st.state,
		Fingerprint: st.fingerprint,
		Owner:       st.owner,
		Response:    st.response,
	}
}

// expired reports whether the record kv, holding st, is free to claim: a
// completed record past its retention on this host's clock, or a claim no
// session holds (which this package never leaves; another tool might).
func (st stored) expired(kv *api.KVPair, now time.Time) bool {
	if st.state == idempotency.StateInProgress {
		return kv.Session == ""
	}
	return now.UnixNano() >= st.expires
}

// storeFormat versions the value encoding, so that a later layout can be
// told from this one.
const storeFormat = 1

// encodeRecord lays st out as: format, state, uvarint-prefixed fingerprint
// and owner, then for a completed record uvarints of the deadline, the
// number of chunks and their directory, and the inline response to the end.
func encodeRecord(st stored) []byte {
	b := make([]byte, 0, 2+5*binary.MaxVarintLen64+len(st.fingerprint)+len(st.owner)+len(st.response))
	b = idemrecord.AppendHeader(b, storeFormat, st.state)
	b = idemrecord.AppendString(b, st.fingerprint)
	b = idemrecord.AppendString(b, st.owner)
	if st.state == idempotency.StateCompleted {
		b = binary.AppendUvarint(b, uint64(st.expires))
		b = binary.AppendUvarint(b, st.chunks)
		b = binary.AppendUvarint(b, st.chunkIndex)
		b = append(b, st.response...)
	}
	return b
}

var errMalformed = fmt.Errorf("%w: consul: malformed idempotency record", idempotency.ErrUnavailable)

// decodeRecord reverses encodeRecord. A value it cannot read was not written
// by this store (or by a newer format): it is reported as the store being
// unusable rather than as a free key, which would let a second owner in.
func decodeRecord(v []byte) (stored, error) {
	r := idemrecord.NewReader(v, storeFormat)
	st := stored{state: r.State()}
	st.fingerprint = r.Field()
	st.owner = r.Field()
	if st.state == idempotency.StateCompleted {
		expires := r.Uvarint()
		st.chunks = r.Uvarint()
		st.chunkIndex = r.Uvarint()
		st.response = r.Rest()
		if expires > math.MaxInt64 {
			return stored{}, errMalformed
		}
		st.expires = int64(expires)
	}
	if !r.OK() {
		return stored{}, errMalformed
	}
	return st, nil
}

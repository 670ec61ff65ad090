package idempotency

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

// MemoryStore is a Store held in this process's memory: for tests, and for a
// single-instance service whose idempotency need not survive a restart. Its
// clock is the process's monotonic clock, so wall-clock jumps do not move
// leases or retention.
type MemoryStore struct {
	mu      sync.Mutex
	epoch   time.Time
	records map[memKey]*memRecord
	// sweepAt is the size at which expired records are next swept out, so
	// that keys never seen again do not pile up, at an amortised O(1) cost.
	sweepAt int
}

type memKey struct{ scope, key string }

type memRecord struct {
	rec Record
	// deadline is the lease end while in progress, the retention end once
	// completed, as an offset on the store's monotonic clock.
	deadline time.Duration
}

// NewMemoryStore returns an empty MemoryStore. Share one value between the
// callers that must agree on an owner.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{epoch: time.Now(), records: make(map[memKey]*memRecord), sweepAt: 1024}
}

// BoundedByContext implements ContextBounded: nothing leaves the process,
// and no call waits on anything but the store's own lock.
func (m *MemoryStore) BoundedByContext() bool { return true }

// now reads the monotonic clock: time.Since uses the monotonic reading that
// time.Now stored in epoch.
func (m *MemoryStore) now() time.Duration { return time.Since(m.epoch) }

// live returns the unexpired record under k, dropping an expired one. The
// caller holds mu.
func (m *MemoryStore) live(k memKey, now time.Duration) *memRecord {
	r := m.records[k]
	if r != nil && now >= r.deadline {
		delete(m.records, k)
		return nil
	}
	return r
}

// owned returns the live in-progress record under k held by owner. The
// caller holds mu.
func (m *MemoryStore) owned(k memKey, owner string, now time.Duration) (*memRecord, error) {
	r := m.live(k, now)
	if r == nil || r.rec.State != StateInProgress || r.rec.Owner != owner {
		return nil, ErrNotOwner
	}
	return r, nil
}

func (m *MemoryStore) sweep(now time.Duration) {
	if len(m.records) < m.sweepAt {
		return
	}
	for k, r := range m.records {
		if now >= r.deadline {
			delete(m.records, k)
		}
	}
	m.sweepAt = max(1024, 2*len(m.records))
}

func copyRecord(r *Record) *Record {
	c := *r
	c.Response = append([]byte(nil), r.Response...)
	return &c
}

// Claim implements Store.
func (m *MemoryStore) Claim(ctx context.Context, c Claim) (*Record, error) {
	if err := errors.Join(CheckContext(ctx), c.Check()); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	k := memKey{c.Scope, c.Key}
	if r := m.live(k, now); r != nil {
		return copyRecord(&r.rec), nil
	}
	m.sweep(now)
	m.records[k] = &memRecord{
		rec: Record{
			Scope: c.Scope, Key: c.Key, State: StateInProgress,
			Fingerprint: c.Fingerprint, Owner: c.Owner,
		},
		deadline: deadline(now, c.Lease),
	}
	return nil, nil
}

// Extend implements Store.
func (m *MemoryStore) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	return m.update(ctx, scope, key, owner, lease, func(r *memRecord) {})
}

// Complete implements Store.
func (m *MemoryStore) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := CheckResponse(response); err != nil {
		return err
	}
	return m.update(ctx, scope, key, owner, retention, func(r *memRecord) {
		r.rec.State = StateCompleted
		r.rec.Response = append([]byte(nil), response...)
	})
}

// update applies change to owner's live in-progress record and sets its
// deadline to d from now.
func (m *MemoryStore) update(ctx context.Context, scope, key, owner string, d time.Duration, change func(*memRecord)) error {
	if err := errors.Join(CheckContext(ctx), CheckKey(scope, key), CheckOwner(owner), CheckDuration(d)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	r, err := m.owned(memKey{scope, key}, owner, now)
	if err != nil {
		return err
	}
	change(r)
	r.deadline = deadline(now, d)
	return nil
}

// deadline is d from now on the store's clock, held at the clock's end
// when the sum would overflow: a lease or retention of a few centuries
// (WithLease(math.MaxInt64)) must not wrap round into the past, where the
// record would count as expired and its key be claimed by another owner.
func deadline(now, d time.Duration) time.Duration {
	if d > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + d
}

// Abandon implements Store.
func (m *MemoryStore) Abandon(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(CheckContext(ctx), CheckKey(scope, key), CheckOwner(owner)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := memKey{scope, key}
	if _, err := m.owned(k, owner, m.now()); err != nil {
		return err
	}
	delete(m.records, k)
	return nil
}

// Get implements Store.
func (m *MemoryStore) Get(ctx context.Context, scope, key string) (*Record, error) {
	if err := errors.Join(CheckContext(ctx), CheckKey(scope, key)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.live(memKey{scope, key}, m.now())
	if r == nil {
		return nil, ErrNotFound
	}
	return copyRecord(&r.rec), nil
}

// Delete implements Deleter.
func (m *MemoryStore) Delete(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(CheckContext(ctx), CheckKey(scope, key)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := memKey{scope, key}
	r := m.live(k, m.now())
	switch {
	case r == nil:
		return ErrNotFound
	case owner != "" && r.rec.Owner != owner:
		return ErrNotOwner
	}
	delete(m.records, k)
	return nil
}

// Ping reports that the store answers, which an in-process store always
// does; it is there for health checks written against every store.
func (m *MemoryStore) Ping(context.Context) error { return nil }

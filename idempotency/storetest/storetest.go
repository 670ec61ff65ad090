// Package storetest is the conformance suite every idempotency.Store runs from
// its own tests, against the real server it talks to. A store is done when it
// passes.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t testing.TB) idempotency.Store { ... })
//	}
//
// Every call of the factory must return a client of the same store, as
// independent of the others as a separate process would be (its own
// connection): the suite proves that clients agree on one owner. Register any
// cleanup with t.Cleanup. Records are keyed uniquely per test and per run, so
// the store need not be empty.
//
// The suite exercises the contract documented on idempotency.Store: the
// atomic claim, the live record a duplicate gets back whatever its
// fingerprint, expiry of an abandoned lease on the store's clock, extension,
// completion and abandonment fenced by the owner token, retention (the
// longest lease and retention a Duration holds included), scope
// isolation, large responses and binary keys, a record too large for the
// store (refused with ErrTooLarge, the claim left to its owner), nil
// contexts refused with ErrInvalid rather than a panic, through an
// idempotency.Executor over the store a key executed but not replayable, a
// caller that left before its result was stored, fingerprints of any length
// and a lost claim whose key the Executor names only as its hash, and,
// given the Silence option, the bound on every call that a store declaring
// idempotency.ContextBounded or idempotency.DeadlineBounded promises,
// against a server gone silent.
//
// Every wait is a deadline on a condition, never a fixed sleep whose length
// decides the outcome, so the suite holds on slow, shared machines.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// Option adjusts the suite.
type Option func(*suite)

// Lease sets the short lease and retention the expiry tests wait out
// (default 400ms). It should be short, but no shorter than the store's clock
// resolution honours.
func Lease(d time.Duration) Option { return func(s *suite) { s.short = d } }

type suite struct {
	newStore func(t testing.TB) idempotency.Store
	short    time.Duration
	silence  func(t testing.TB) (idempotency.Store, func())
}

// long is a lease no test outlives, for the claims that must stay put.
const long = 5 * time.Minute

func (s *suite) patience() time.Duration { return 20*s.short + 10*time.Second }

// Run runs the conformance suite as subtests of t. newStore returns a new
// client of the store under test.
func Run(t *testing.T, newStore func(t testing.TB) idempotency.Store, opts ...Option) {
	if newStore == nil {
		t.Fatal("storetest: newStore is nil")
	}
	s := &suite{newStore: newStore, short: 400 * time.Millisecond}
	for _, o := range opts {
		o(s)
	}
	t.Run("ClaimThenDuplicate", s.testClaimThenDuplicate)
	t.Run("CompleteThenGet", s.testCompleteThenGet)
	t.Run("LeaseExpiry", s.testLeaseExpiry)
	t.Run("ExpiredLeaseIsNotRevived", s.testExpiredNotRevived)
	t.Run("ExtendKeepsClaim", s.testExtend)
	t.Run("RetentionExpiry", s.testRetention)
	t.Run("LongestDurations", s.testLongestDurations)
	t.Run("AbandonLetsRetryClaim", s.testAbandon)
	t.Run("ConcurrentClaimsOneWinner", s.testConcurrentClaims)
	t.Run("ScopeIsolation", s.testScopes)
	t.Run("LargeResponse", s.testLargeResponse)
	t.Run("BinaryKeys", s.testBinaryKeys)
	t.Run("InvalidArguments", s.testInvalid)
	t.Run("NilContext", s.testNilContext)
	t.Run("RecordTooLarge", s.testTooLarge)
	t.Run("ExecutedNotReplayable", s.testNotReplayable)
	t.Run("LongFingerprints", s.testLongFingerprints)
	t.Run("CallerGoneStillStored", s.testCallerGone)
	t.Run("KeyNeverLogged", s.testKeyNeverLogged)
	t.Run("Delete", s.testDelete)
	t.Run("BoundedCalls", s.testBoundedCalls)
}

var seq atomic.Int64

// key returns a key no earlier test (in this process or a previous run
// against the same server) has used.
func key(t testing.TB) string {
	return fmt.Sprintf("storetest/%s/%d-%d", t.Name(), time.Now().UnixNano(), seq.Add(1))
}

var ownerSeq atomic.Int64

func owner(name string) string {
	return fmt.Sprintf("%s-%d-%d", name, time.Now().UnixNano(), ownerSeq.Add(1))
}

func (s *suite) ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.patience())
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it is true or the suite's patience runs out.
func (s *suite) eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(s.patience())
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", s.patience(), what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustClaim(t testing.TB, st idempotency.Store, ctx context.Context, c idempotency.Claim) {
	t.Helper()
	rec, err := st.Claim(ctx, c)
	if err != nil {
		t.Fatalf("Claim(%q, %q) by %s: %v", c.Scope, c.Key, c.Owner, err)
	}
	if rec != nil {
		t.Fatalf("Claim(%q, %q) by %s on a free key returned a record (state %s, owner %s)", c.Scope, c.Key, c.Owner, rec.State, rec.Owner)
	}
}

// mustConflict claims c on a taken key and returns the live record it gets.
func mustConflict(t testing.TB, st idempotency.Store, ctx context.Context, c idempotency.Claim) *idempotency.Record {
	t.Helper()
	rec, err := st.Claim(ctx, c)
	if err != nil {
		t.Fatalf("Claim(%q, %q) by %s on a taken key: %v", c.Scope, c.Key, c.Owner, err)
	}
	if rec == nil {
		t.Fatalf("Claim(%q, %q) by %s succeeded on a taken key", c.Scope, c.Key, c.Owner)
	}
	return rec
}

func mustGet(t testing.TB, st idempotency.Store, ctx context.Context, scope, k string) *idempotency.Record {
	t.Helper()
	rec, err := st.Get(ctx, scope, k)
	if err != nil {
		t.Fatalf("Get(%q, %q): %v", scope, k, err)
	}
	if rec == nil {
		t.Fatalf("Get(%q, %q) returned a nil record and no error", scope, k)
	}
	return rec
}

func expectNotFound(t testing.TB, st idempotency.Store, ctx context.Context, scope, k string) {
	t.Helper()
	rec, err := st.Get(ctx, scope, k)
	if !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get(%q, %q): got (%v, %v), want ErrNotFound", scope, k, rec, err)
	}
}

func expectIs(t testing.TB, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

func expectRecord(t testing.TB, rec *idempotency.Record, want idempotency.Record) {
	t.Helper()
	if rec.Scope != want.Scope || rec.Key != want.Key {
		t.Errorf("record is under (%q, %q), want (%q, %q)", rec.Scope, rec.Key, want.Scope, want.Key)
	}
	if rec.State != want.State {
		t.Errorf("record state %q, want %q", rec.State, want.State)
	}
	if rec.Fingerprint != want.Fingerprint {
		t.Errorf("record fingerprint %q, want %q", rec.Fingerprint, want.Fingerprint)
	}
	if rec.Owner != want.Owner {
		t.Errorf("record owner %q, want %q", rec.Owner, want.Owner)
	}
	if !bytes.Equal(rec.Response, want.Response) {
		t.Errorf("record response of %d bytes differs from the %d bytes stored", len(rec.Response), len(want.Response))
	}
}

func (s *suite) testClaimThenDuplicate(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	k := key(t)
	first := idempotency.Claim{Scope: "tenant", Key: k, Fingerprint: "fp-1", Owner: owner("a"), Lease: long}
	expectNotFound(t, a, ctx, "tenant", k)
	mustClaim(t, a, ctx, first)

	want := idempotency.Record{Scope: "tenant", Key: k, State: idempotency.StateInProgress, Fingerprint: "fp-1", Owner: first.Owner}
	// A duplicate with the same request, and one with another request, both
	// get the live record back: judging the fingerprint is the caller's job.
	for _, fp := range []string{"fp-1", "fp-2"} {
		dup := idempotency.Claim{Scope: "tenant", Key: k, Fingerprint: fp, Owner: owner("b"), Lease: long}
		expectRecord(t, mustConflict(t, b, ctx, dup), want)
	}
	// The owner itself claiming again does not steal or reset anything.
	expectRecord(t, mustConflict(t, a, ctx, first), want)
	expectRecord(t, mustGet(t, b, ctx, "tenant", k), want)
}

func (s *suite) testCompleteThenGet(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	k := key(t)
	c := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: long}
	mustClaim(t, a, ctx, c)
	if err := a.Extend(ctx, "", k, c.Owner, long); err != nil {
		t.Fatalf("Extend by the owner: %v", err)
	}
	resp := []byte("HTTP/1.1 201 Created\r\n\r\n{\"id\":1}\x00\xff")
	if err := a.Complete(ctx, "", k, c.Owner, resp, long); err != nil {
		t.Fatalf("Complete by the owner: %v", err)
	}
	want := idempotency.Record{Key: k, State: idempotency.StateCompleted, Fingerprint: "fp", Owner: c.Owner, Response: resp}
	expectRecord(t, mustGet(t, b, ctx, "", k), want)
	expectRecord(t, mustConflict(t, b, ctx, idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("b"), Lease: long}), want)
	expectRecord(t, mustConflict(t, b, ctx, idempotency.Claim{Key: k, Fingerprint: "other", Owner: owner("b"), Lease: long}), want)

	// A completed record is final: its owner can neither rewrite nor
	// release it, and nothing renews it as a claim.
	expectIs(t, "second Complete", a.Complete(ctx, "", k, c.Owner, []byte("rewritten"), long), idempotency.ErrNotOwner)
	expectIs(t, "Extend after Complete", a.Extend(ctx, "", k, c.Owner, long), idempotency.ErrNotOwner)
	expectIs(t, "Abandon after Complete", a.Abandon(ctx, "", k, c.Owner), idempotency.ErrNotOwner)
	expectRecord(t, mustGet(t, a, ctx, "", k), want)

	// Operations on a key never claimed are refused too.
	nk := key(t)
	expectIs(t, "Complete of a key never claimed", a.Complete(ctx, "", nk, c.Owner, resp, long), idempotency.ErrNotOwner)
	expectIs(t, "Extend of a key never claimed", a.Extend(ctx, "", nk, c.Owner, long), idempotency.ErrNotOwner)
	expectIs(t, "Abandon of a key never claimed", a.Abandon(ctx, "", nk, c.Owner), idempotency.ErrNotOwner)
	expectNotFound(t, a, ctx, "", nk)
}

// testLeaseExpiry: an owner that vanished (no Extend) loses the key when its
// lease runs out; a new owner claims it, and the stale owner's writes are
// refused without touching the new owner's record.
func (s *suite) testLeaseExpiry(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	k := key(t)
	stale := idempotency.Claim{Scope: "s", Key: k, Fingerprint: "fp", Owner: owner("stale"), Lease: s.short}
	mustClaim(t, a, ctx, stale)

	fresh := idempotency.Claim{Scope: "s", Key: k, Fingerprint: "fp", Owner: owner("fresh"), Lease: long}
	s.eventually(t, "the stale lease expires and a new owner claims the key", func() bool {
		rec, err := b.Claim(ctx, fresh)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if rec != nil && rec.Owner != stale.Owner {
			t.Fatalf("while waiting for the lease to expire, the record's owner became %q", rec.Owner)
		}
		return rec == nil
	})
	want := idempotency.Record{Scope: "s", Key: k, State: idempotency.StateInProgress, Fingerprint: "fp", Owner: fresh.Owner}
	expectRecord(t, mustGet(t, a, ctx, "s", k), want)

	expectIs(t, "stale Extend", a.Extend(ctx, "s", k, stale.Owner, long), idempotency.ErrNotOwner)
	expectIs(t, "stale Complete", a.Complete(ctx, "s", k, stale.Owner, []byte("late"), long), idempotency.ErrNotOwner)
	expectIs(t, "stale Abandon", a.Abandon(ctx, "s", k, stale.Owner), idempotency.ErrNotOwner)
	expectRecord(t, mustGet(t, a, ctx, "s", k), want)

	if err := b.Complete(ctx, "s", k, fresh.Owner, []byte("fresh"), long); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
	want.State, want.Response = idempotency.StateCompleted, []byte("fresh")
	expectRecord(t, mustGet(t, a, ctx, "s", k), want)
}

// testExpiredNotRevived: once a lease has run out on the store's clock, its
// owner can neither extend nor complete it, even with no one else claiming.
// A control key claimed after the target with the same lease tells the suite,
// without reading any clock, that the target's deadline has passed.
func (s *suite) testExpiredNotRevived(t *testing.T) {
	ctx := s.ctx(t)
	st := s.newStore(t)
	k, control := key(t), key(t)
	c := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: s.short}
	mustClaim(t, st, ctx, c)
	mustClaim(t, st, ctx, idempotency.Claim{Key: control, Owner: owner("control"), Lease: s.short})
	s.eventually(t, "the control key's lease expires", func() bool {
		_, err := st.Get(ctx, "", control)
		if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Get: %v", err)
		}
		return err != nil
	})
	// The owner's writes must fail at once; the record itself may linger a
	// moment where the store evicts expired records asynchronously (etcd
	// revokes leases that expire together in no fixed order).
	expectIs(t, "Extend of an expired lease", st.Extend(ctx, "", k, c.Owner, long), idempotency.ErrNotOwner)
	expectIs(t, "Complete of an expired lease", st.Complete(ctx, "", k, c.Owner, []byte("late"), long), idempotency.ErrNotOwner)
	s.eventually(t, "the expired claim is gone", func() bool {
		_, err := st.Get(ctx, "", k)
		if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("Get: %v", err)
		}
		return err != nil
	})
	mustClaim(t, st, ctx, idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("b"), Lease: long})
}

// testExtend: a claim taken with a short lease and extended outlives a control
// claim taken after it with the same short lease.
func (s *suite) testExtend(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	k, control := key(t), key(t)
	c := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: s.short}
	mustClaim(t, a, ctx, c)
	if err := a.Extend(ctx, "", k, c.Owner, long); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	mustClaim(t, a, ctx, idempotency.Claim{Key: control, Owner: owner("control"), Lease: s.short})
	s.eventually(t, "the control claim expires", func() bool {
		rec, err := b.Claim(ctx, idempotency.Claim{Key: control, Owner: owner("b"), Lease: long})
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		return rec == nil
	})
	rec := mustConflict(t, b, ctx, idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("b"), Lease: long})
	expectRecord(t, rec, idempotency.Record{Key: k, State: idempotency.StateInProgress, Fingerprint: "fp", Owner: c.Owner})
	if err := a.Complete(ctx, "", k, c.Owner, []byte("done"), long); err != nil {
		t.Fatalf("Complete after Extend: %v", err)
	}
}

func (s *suite) testRetention(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	k := key(t)
	c := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: long}
	mustClaim(t, a, ctx, c)
	if err := a.Complete(ctx, "", k, c.Owner, []byte("kept briefly"), s.short); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	// Retention runs from Complete, not from the claim: the long lease is
	// no longer what keeps the record.
	next := idempotency.Claim{Key: k, Fingerprint: "fp-2", Owner: owner("b"), Lease: long}
	s.eventually(t, "the completed record's retention runs out", func() bool {
		rec, err := b.Claim(ctx, next)
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		if rec != nil && (rec.State != idempotency.StateCompleted || rec.Owner != c.Owner) {
			t.Fatalf("while waiting for retention, the record became %s owned by %q", rec.State, rec.Owner)
		}
		return rec == nil
	})
	expectRecord(t, mustGet(t, a, ctx, "", k), idempotency.Record{Key: k, State: idempotency.StateInProgress, Fingerprint: "fp-2", Owner: next.Owner})
	expectIs(t, "the first owner's Complete after retention", a.Complete(ctx, "", k, c.Owner, []byte("again"), long), idempotency.ErrNotOwner)
}

// testLongestDurations: the longest lease and retention a Claim's Check
// lets through (math.MaxInt64, some 292 years) hold the key, rather than
// overflowing the store's deadline arithmetic into one already past, which
// would let a second owner claim it at once.
func (s *suite) testLongestDurations(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	k := key(t)
	c := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: math.MaxInt64}
	mustClaim(t, a, ctx, c)
	rival := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("b"), Lease: long}
	expectRecord(t, mustConflict(t, b, ctx, rival), idempotency.Record{Key: k, State: idempotency.StateInProgress, Fingerprint: "fp", Owner: c.Owner})
	if err := a.Extend(ctx, "", k, c.Owner, math.MaxInt64); err != nil {
		t.Fatalf("Extend by %v: %v", time.Duration(math.MaxInt64), err)
	}
	expectRecord(t, mustConflict(t, b, ctx, rival), idempotency.Record{Key: k, State: idempotency.StateInProgress, Fingerprint: "fp", Owner: c.Owner})
	if err := a.Complete(ctx, "", k, c.Owner, []byte("kept"), math.MaxInt64); err != nil {
		t.Fatalf("Complete with a retention of %v: %v", time.Duration(math.MaxInt64), err)
	}
	expectRecord(t, mustConflict(t, b, ctx, rival), idempotency.Record{Key: k, State: idempotency.StateCompleted, Fingerprint: "fp", Owner: c.Owner, Response: []byte("kept")})
}

func (s *suite) testAbandon(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	k := key(t)
	c := idempotency.Claim{Scope: "s", Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: long}
	mustClaim(t, a, ctx, c)
	// Only the owner can release the claim.
	expectIs(t, "Abandon by a stranger", b.Abandon(ctx, "s", k, owner("stranger")), idempotency.ErrNotOwner)
	expectIs(t, "Complete by a stranger", b.Complete(ctx, "s", k, owner("stranger"), []byte("x"), long), idempotency.ErrNotOwner)
	expectIs(t, "Extend by a stranger", b.Extend(ctx, "s", k, owner("stranger"), long), idempotency.ErrNotOwner)

	if err := a.Abandon(ctx, "s", k, c.Owner); err != nil {
		t.Fatalf("Abandon by the owner: %v", err)
	}
	expectNotFound(t, b, ctx, "s", k)
	retry := idempotency.Claim{Scope: "s", Key: k, Fingerprint: "fp", Owner: owner("b"), Lease: long}
	mustClaim(t, b, ctx, retry)
	expectIs(t, "second Abandon", a.Abandon(ctx, "s", k, c.Owner), idempotency.ErrNotOwner)
	expectIs(t, "Complete after Abandon", a.Complete(ctx, "s", k, c.Owner, []byte("late"), long), idempotency.ErrNotOwner)
	expectRecord(t, mustGet(t, a, ctx, "s", k), idempotency.Record{Scope: "s", Key: k, State: idempotency.StateInProgress, Fingerprint: "fp", Owner: retry.Owner})
}

// testDelete checks a store's idempotency.Deleter, when it has one: an
// operator removes an in-progress claim and a completed record alike, the
// old owner finds its claim gone, and the key runs afresh; a delete naming
// an owner leaves another owner's record (the claim the operator was shown
// lapsed, and another request claimed the key or completed it).
func (s *suite) testDelete(t *testing.T) {
	a, admin := s.newStore(t), s.newStore(t)
	del, ok := admin.(idempotency.Deleter)
	if !ok {
		t.Skip("the store does not implement idempotency.Deleter")
	}
	ctx := s.ctx(t)
	k := key(t)
	expectIs(t, "Delete of nothing", del.Delete(ctx, "s", k, ""), idempotency.ErrNotFound)
	expectIs(t, "Delete of nothing, by owner", del.Delete(ctx, "s", k, owner("a")), idempotency.ErrNotFound)
	c := idempotency.Claim{Scope: "s", Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: long}
	mustClaim(t, a, ctx, c)
	expectIs(t, "Delete of an in-progress claim by another owner", del.Delete(ctx, "s", k, owner("x")), idempotency.ErrNotOwner)
	expectRecord(t, mustGet(t, a, ctx, "s", k), idempotency.Record{Scope: "s", Key: k, State: idempotency.StateInProgress, Fingerprint: "fp", Owner: c.Owner})
	if err := del.Delete(ctx, "s", k, c.Owner); err != nil {
		t.Fatalf("Delete of an in-progress claim by its owner: %v", err)
	}
	expectNotFound(t, a, ctx, "s", k)
	expectIs(t, "Extend after Delete", a.Extend(ctx, "s", k, c.Owner, long), idempotency.ErrNotOwner)
	expectIs(t, "Complete after Delete", a.Complete(ctx, "s", k, c.Owner, []byte("late"), long), idempotency.ErrNotOwner)

	again := idempotency.Claim{Scope: "s", Key: k, Fingerprint: "fp", Owner: owner("b"), Lease: long}
	mustClaim(t, a, ctx, again)
	if err := a.Complete(ctx, "s", k, again.Owner, []byte("done"), long); err != nil {
		t.Fatal(err)
	}
	expectIs(t, "Delete of a completed record by the earlier owner", del.Delete(ctx, "s", k, c.Owner), idempotency.ErrNotOwner)
	if rec := mustGet(t, a, ctx, "s", k); rec.State != idempotency.StateCompleted || rec.Owner != again.Owner {
		t.Fatalf("after a refused Delete: %+v, want b's completed record", rec)
	}
	if err := del.Delete(ctx, "s", k, again.Owner); err != nil {
		t.Fatalf("Delete of a completed record by its owner: %v", err)
	}
	expectNotFound(t, a, ctx, "s", k)
	last := idempotency.Claim{Scope: "s", Key: k, Fingerprint: "fp", Owner: owner("c"), Lease: long}
	mustClaim(t, a, ctx, last)
	if err := del.Delete(ctx, "s", k, ""); err != nil {
		t.Fatalf("Delete whatever the owner: %v", err)
	}
	expectNotFound(t, a, ctx, "s", k)
	expectIs(t, "Delete of an invalid key", del.Delete(ctx, "s", "", ""), idempotency.ErrInvalid)
}

// testConcurrentClaims: contenders on separate clients race for one key;
// exactly one wins and every loser is shown the winner's record.
func (s *suite) testConcurrentClaims(t *testing.T) {
	const n = 16
	ctx := s.ctx(t)
	stores := make([]idempotency.Store, n)
	for i := range stores {
		stores[i] = s.newStore(t)
	}
	for round := range 3 {
		k := key(t)
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			owners  [n]string
			records [n]*idempotency.Record
			errs    [n]error
		)
		for i := range n {
			owners[i] = owner(fmt.Sprintf("c%d", i))
			wg.Go(func() {
				<-start
				records[i], errs[i] = stores[i].Claim(ctx, idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owners[i], Lease: long})
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("round %d: Claim by contender %d: %v", round, i, errs[i])
			}
			if records[i] == nil {
				if winner >= 0 {
					t.Fatalf("round %d: contenders %d and %d both claimed the key", round, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no contender claimed the free key", round)
		}
		for i := range n {
			if i != winner && records[i].Owner != owners[winner] {
				t.Errorf("round %d: contender %d was shown owner %q, the winner is %q", round, i, records[i].Owner, owners[winner])
			}
		}
	}
}

// testScopes: the same key under two scopes is two records, and scopes and
// keys that would collide if simply joined stay apart.
func (s *suite) testScopes(t *testing.T) {
	ctx := s.ctx(t)
	st := s.newStore(t)
	k := key(t)
	pairs := [][2]string{
		{"alice", k},
		{"bob", k},
		{"", k},
		{"alice:" + k, "x"},
		{"alice", k + ":x"},
		{"alice/" + k, "x"},
		{"alice", k + "/x"},
		{"alice\x00" + k, "x"},
		{"alice", k + "\x00x"},
	}
	for i, p := range pairs {
		mustClaim(t, st, ctx, idempotency.Claim{Scope: p[0], Key: p[1], Fingerprint: fmt.Sprint(i), Owner: owner("o"), Lease: long})
	}
	for i, p := range pairs {
		rec := mustGet(t, st, ctx, p[0], p[1])
		if rec.Scope != p[0] || rec.Key != p[1] || rec.Fingerprint != fmt.Sprint(i) {
			t.Errorf("Get(%q, %q) returned the record of (%q, %q) with fingerprint %q, want fingerprint %d", p[0], p[1], rec.Scope, rec.Key, rec.Fingerprint, i)
		}
	}
	// Completing under one scope leaves the other alone.
	alice := mustGet(t, st, ctx, "alice", k)
	if err := st.Complete(ctx, "alice", k, alice.Owner, []byte("alice's"), long); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if bob := mustGet(t, st, ctx, "bob", k); bob.State != idempotency.StateInProgress || len(bob.Response) != 0 {
		t.Errorf("bob's record became %s with %q after alice's completed", bob.State, bob.Response)
	}
	expectIs(t, "Complete under another scope with alice's owner token", st.Complete(ctx, "bob", k, alice.Owner, []byte("x"), long), idempotency.ErrNotOwner)
}

func (s *suite) testLargeResponse(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	for _, size := range []int{0, 1, idempotency.MaxResponseLen} {
		k := key(t)
		resp := make([]byte, size)
		rand.Read(resp)
		c := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: long}
		mustClaim(t, a, ctx, c)
		if err := a.Complete(ctx, "", k, c.Owner, resp, long); err != nil {
			t.Fatalf("Complete with %d bytes: %v", size, err)
		}
		rec := mustGet(t, b, ctx, "", k)
		if !bytes.Equal(rec.Response, resp) {
			t.Errorf("a response of %d bytes came back as %d different bytes", size, len(rec.Response))
		}
		if rec.State != idempotency.StateCompleted {
			t.Errorf("state %q after Complete, want completed", rec.State)
		}
	}
}

// testBinaryKeys: scopes and keys are opaque bytes up to the limits.
func (s *suite) testBinaryKeys(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	// Short, so that it fits beside 200 other bytes whatever the test's name.
	unique := fmt.Sprintf("bin-%d-%d", time.Now().UnixNano(), seq.Add(1))
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	keys := []string{
		unique + " with spaces, \"quotes\", 'apostrophes', \\backslash, %25, *?[]{}",
		unique + "-ключ-🔑-鍵",
		unique + "\x00\x01\xfe\xff",
		string(all[:idempotency.MaxKeyLen-len(unique)]) + unique,
		unique + strings.Repeat("k", idempotency.MaxKeyLen-len(unique)),
	}
	scope := string(all[:idempotency.MaxScopeLen])
	for i, k := range keys {
		for _, sc := range []string{"", scope} {
			c := idempotency.Claim{Scope: sc, Key: k, Fingerprint: fmt.Sprintf("fp\x00%d", i), Owner: owner("a"), Lease: long}
			mustClaim(t, a, ctx, c)
			resp := []byte(k)
			if err := a.Complete(ctx, sc, k, c.Owner, resp, long); err != nil {
				t.Fatalf("Complete(key %d, scope of %d bytes): %v", i, len(sc), err)
			}
			rec := mustGet(t, b, ctx, sc, k)
			expectRecord(t, rec, idempotency.Record{Scope: sc, Key: k, State: idempotency.StateCompleted, Fingerprint: c.Fingerprint, Owner: c.Owner, Response: resp})
		}
	}
}

func (s *suite) testInvalid(t *testing.T) {
	ctx := s.ctx(t)
	st := s.newStore(t)
	k := key(t)
	tooLong := strings.Repeat("k", idempotency.MaxKeyLen+1)
	for _, c := range []idempotency.Claim{
		{Key: "", Owner: "o", Lease: long},
		{Key: tooLong, Owner: "o", Lease: long},
		{Scope: strings.Repeat("s", idempotency.MaxScopeLen+1), Key: k, Owner: "o", Lease: long},
		{Key: k, Owner: "", Lease: long},
		{Key: k, Owner: "o", Lease: 0},
		{Key: k, Owner: "o", Lease: -time.Second},
		{Key: k, Fingerprint: strings.Repeat("f", idempotency.MaxFingerprintLen+1), Owner: "o", Lease: long},
	} {
		rec, err := st.Claim(ctx, c)
		if !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("Claim(key of %d bytes, scope of %d bytes, fingerprint of %d bytes, owner %q, lease %v): got (%v, %v), want ErrInvalid",
				len(c.Key), len(c.Scope), len(c.Fingerprint), c.Owner, c.Lease, rec, err)
		}
	}
	c := idempotency.Claim{Key: k, Owner: owner("a"), Lease: long}
	mustClaim(t, st, ctx, c)
	expectIs(t, "Extend with a zero lease", st.Extend(ctx, "", k, c.Owner, 0), idempotency.ErrInvalid)
	expectIs(t, "Complete with a zero retention", st.Complete(ctx, "", k, c.Owner, nil, 0), idempotency.ErrInvalid)
	expectIs(t, "Complete with an empty owner", st.Complete(ctx, "", k, "", nil, long), idempotency.ErrInvalid)
	expectIs(t, "Abandon with an empty owner", st.Abandon(ctx, "", k, ""), idempotency.ErrInvalid)
	expectIs(t, "Abandon with an empty key", st.Abandon(ctx, "", "", c.Owner), idempotency.ErrInvalid)
	_, err := st.Get(ctx, "", tooLong)
	expectIs(t, "Get with a key too long", err, idempotency.ErrInvalid)
	// The record is untouched by the refused calls.
	expectRecord(t, mustGet(t, st, ctx, "", k), idempotency.Record{Key: k, State: idempotency.StateInProgress, Owner: c.Owner})
}

// testNilContext: a nil context is refused with ErrInvalid by every method,
// never a panic.
func (s *suite) testNilContext(t *testing.T) {
	st := s.newStore(t)
	var nilCtx context.Context
	k := key(t)
	o := owner("a")
	calls := map[string]func() error{
		"Claim": func() error {
			_, err := st.Claim(nilCtx, idempotency.Claim{Key: k, Owner: o, Lease: long})
			return err
		},
		"Extend":   func() error { return st.Extend(nilCtx, "", k, o, long) },
		"Complete": func() error { return st.Complete(nilCtx, "", k, o, []byte("x"), long) },
		"Abandon":  func() error { return st.Abandon(nilCtx, "", k, o) },
		"Get": func() error {
			_, err := st.Get(nilCtx, "", k)
			return err
		},
	}
	if del, ok := st.(idempotency.Deleter); ok {
		calls["Delete"] = func() error { return del.Delete(nilCtx, "", k, o) }
	}
	for name, call := range calls {
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("%s with a nil context panicked: %v", name, v)
				}
			}()
			expectIs(t, name+" with a nil context", call(), idempotency.ErrInvalid)
		}()
	}
	expectNotFound(t, st, s.ctx(t), "", k)
}

// testTooLarge: a response over MaxResponseLen is refused with ErrTooLarge
// and changes nothing: the claim is still its owner's, who completes it with
// a smaller record.
func (s *suite) testTooLarge(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.newStore(t), s.newStore(t)
	k := key(t)
	c := idempotency.Claim{Key: k, Fingerprint: "fp", Owner: owner("a"), Lease: long}
	mustClaim(t, a, ctx, c)
	expectIs(t, "Complete with a response over MaxResponseLen",
		a.Complete(ctx, "", k, c.Owner, make([]byte, idempotency.MaxResponseLen+1), long), idempotency.ErrTooLarge)
	want := idempotency.Record{Key: k, State: idempotency.StateInProgress, Fingerprint: "fp", Owner: c.Owner}
	expectRecord(t, mustGet(t, b, ctx, "", k), want)
	if err := a.Complete(ctx, "", k, c.Owner, []byte("marker"), long); err != nil {
		t.Fatalf("Complete with a small record after ErrTooLarge: %v", err)
	}
	want.State, want.Response = idempotency.StateCompleted, []byte("marker")
	expectRecord(t, mustGet(t, b, ctx, "", k), want)
}

// executor returns an Executor over a new client of the store.
func (s *suite) executor(t testing.TB, opts ...idempotency.Option) *idempotency.Executor {
	e, err := idempotency.New(s.newStore(t), opts...)
	if err != nil {
		t.Fatalf("idempotency.New: %v", err)
	}
	return e
}

// testNotReplayable: a key whose work was done but whose result cannot be
// replayed (too large, or so said by the work itself) is completed all the
// same: a repeat on another client gets ErrNotReplayable, and the work
// never runs twice.
func (s *suite) testNotReplayable(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.executor(t), s.executor(t)
	for _, tc := range []struct {
		name    string
		out     []byte
		err     error
		summary string
	}{
		{"result over the limit", make([]byte, idempotency.MaxResultLen+1), nil, ""},
		{"streamed", []byte("201 Location: /orders/7"), fmt.Errorf("streamed: %w", idempotency.ErrNotReplayable), "201 Location: /orders/7"},
	} {
		k := key(t)
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) {
			runs.Add(1)
			return tc.out, tc.err
		}
		if res, err := a.Do(ctx, k, "fp", fn); res.Replayed || (err != nil && !errors.Is(err, idempotency.ErrNotReplayable)) {
			t.Fatalf("%s: first Do: (replayed %v, %v)", tc.name, res.Replayed, err)
		}
		for range 2 {
			res, err := b.Do(ctx, k, "fp", fn)
			if !errors.Is(err, idempotency.ErrNotReplayable) || string(res.Response) != tc.summary {
				t.Errorf("%s: repeat got (%q, %v), want ErrNotReplayable with %q", tc.name, res.Response, err, tc.summary)
			}
		}
		if runs.Load() != 1 {
			t.Errorf("%s: the work ran %d times, want 1", tc.name, runs.Load())
		}
	}
}

// testLongFingerprints: through an Executor, a fingerprint of any length
// (a caller's own: the request body itself, say) works on the store, and
// so does one of MaxFingerprintLen, which the store keeps as it is: the
// first call runs, its repeat on another client replays, and a call whose
// fingerprint differs in its last byte only is refused as another request.
func (s *suite) testLongFingerprints(t *testing.T) {
	ctx := s.ctx(t)
	a, b := s.executor(t), s.executor(t)
	for _, n := range []int{idempotency.MaxFingerprintLen, 2 << 20} {
		k := key(t)
		fp := strings.Repeat("f", n)
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) {
			runs.Add(1)
			return []byte("order 1"), nil
		}
		if _, err := a.Do(ctx, k, fp, fn); err != nil {
			t.Fatalf("first Do with a fingerprint of %d bytes: %v", n, err)
		}
		if res, err := b.Do(ctx, k, fp, fn); err != nil || !res.Replayed || string(res.Response) != "order 1" {
			t.Errorf("repeat with a fingerprint of %d bytes: (%q, replayed %v, %v), want %q replayed", n, res.Response, res.Replayed, err, "order 1")
		}
		_, err := b.Do(ctx, k, fp[:n-1]+"g", fn)
		expectIs(t, fmt.Sprintf("Do with a fingerprint of %d bytes differing in its last", n), err, idempotency.ErrFingerprintMismatch)
		if runs.Load() != 1 {
			t.Errorf("fingerprint of %d bytes: the work ran %d times, want 1", n, runs.Load())
		}
	}
}

// testKeyNeverLogged: an Executor over the store whose claim is taken from
// it while the work runs (its record abandoned by another client) names
// the key only as its hash, in what it logs, in the cause it gives the
// work and in the error it returns, even where the store's own errors
// quote the key: a key is often a secret-like token.
func (s *suite) testKeyNeverLogged(t *testing.T) {
	ctx := s.ctx(t)
	var logs drivertest.LogBuffer
	e := s.executor(t, idempotency.WithLease(3*s.short), idempotency.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	other := s.newStore(t)
	const secret = "never-logged-6b1f"
	k := key(t) + "/" + secret
	var cause error
	_, err := e.Do(ctx, k, "fp", func(fctx context.Context) ([]byte, error) {
		rec := mustGet(t, other, ctx, "", k)
		if err := other.Abandon(ctx, "", k, rec.Owner); err != nil {
			t.Errorf("Abandon by another client: %v", err)
		}
		select {
		case <-fctx.Done():
			cause = context.Cause(fctx)
		case <-ctx.Done():
		}
		return []byte("done"), nil
	})
	if cause == nil {
		t.Fatalf("the work was not told its claim was lost; Do returned %v", err)
	}
	if !errors.Is(err, idempotency.ErrNotOwner) {
		t.Errorf("Do after its claim was taken: %v, want ErrNotOwner", err)
	}
	for what, text := range map[string]string{"the log": logs.String(), "the work's cause": cause.Error(), "Do's error": err.Error()} {
		if strings.Contains(text, secret) {
			t.Errorf("%s names the key: %s", what, text)
		}
	}
}

// testCallerGone: the caller that claimed the key leaves while the work
// runs; the work finishes, its result is stored, and the retry on another
// client gets it replayed instead of running the work again.
func (s *suite) testCallerGone(t *testing.T) {
	// Three short leases: renewed every third of it, so that a renewal
	// descheduled for a moment on a loaded machine (under -race, a 400ms
	// lease was seen lost) does not end the claim; its loss is not the
	// subject here.
	lease := 3 * s.short
	a, b := s.executor(t, idempotency.WithLease(lease)), s.executor(t)
	k := key(t)
	ctx, cancel := context.WithCancel(s.ctx(t))
	var runs atomic.Int64
	_, err := a.Do(ctx, k, "fp", func(fctx context.Context) ([]byte, error) {
		runs.Add(1)
		cancel()
		<-fctx.Done()
		// Outlive the lease: only the renewals keep the claim.
		time.Sleep(lease + s.short)
		return []byte("order 1"), nil
	})
	if err != nil {
		t.Fatalf("Do whose caller left: %v", err)
	}
	res, err := b.Do(s.ctx(t), k, "fp", func(context.Context) ([]byte, error) {
		runs.Add(1)
		return []byte("order 2"), nil
	})
	if err != nil || !res.Replayed || string(res.Response) != "order 1" || runs.Load() != 1 {
		t.Errorf("retry: (%q, replayed %v, %v), work ran %d times; want order 1 replayed and one run", res.Response, res.Replayed, err, runs.Load())
	}
}

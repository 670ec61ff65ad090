package storetest

import (
	"context"
	"testing"

	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// Silence gives the suite a store whose server can go silent: f returns a
// new client of the store, as the factory does, and a func that makes its
// server stop answering it while its connections stay open (as
// drivertest.Proxy's Blackhole does). The suite then checks the promise of
// idempotency.ContextBounded or idempotency.DeadlineBounded when the store
// makes it; that test is skipped without Silence.
func Silence(f func(t testing.TB) (st idempotency.Store, silence func())) Option {
	return func(s *suite) { s.silence = f }
}

// testBoundedCalls checks, given the Silence option, the bound a store that
// declares idempotency.ContextBounded or idempotency.DeadlineBounded
// promises (see drivertest.CheckBounded).
func (s *suite) testBoundedCalls(t *testing.T) {
	if s.silence == nil {
		t.Skip("no Silence option")
	}
	st, silence := s.silence(t)
	cb, _ := st.(idempotency.ContextBounded)
	byCtx := cb != nil && cb.BoundedByContext()
	db, _ := st.(idempotency.DeadlineBounded)
	if !byCtx && (db == nil || !db.BoundedByDeadline()) {
		t.Skip("the store declares no bound of its own: the Executor bounds its calls")
	}
	claimed, k := key(t), key(t)
	o := owner("a")
	if _, err := st.Claim(s.ctx(t), idempotency.Claim{Key: claimed, Owner: o, Lease: long}); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	silence()

	calls := []drivertest.BoundedCall{
		{Name: "Claim", Call: func(ctx context.Context) error {
			_, err := st.Claim(ctx, idempotency.Claim{Key: k, Owner: o, Lease: long})
			return err
		}},
		{Name: "Get", Call: func(ctx context.Context) error {
			_, err := st.Get(ctx, "", claimed)
			return err
		}},
		{Name: "Extend", Call: func(ctx context.Context) error { return st.Extend(ctx, "", claimed, o, long) }},
		{Name: "Complete", Call: func(ctx context.Context) error { return st.Complete(ctx, "", claimed, o, []byte("x"), long) }},
		{Name: "Abandon", Call: func(ctx context.Context) error { return st.Abandon(ctx, "", claimed, o) }},
	}
	if del, ok := st.(idempotency.Deleter); ok {
		calls = append(calls, drivertest.BoundedCall{Name: "Delete", Call: func(ctx context.Context) error { return del.Delete(ctx, "", claimed, o) }})
	}
	drivertest.CheckBounded(t, byCtx, calls)
}

package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// failingCompletes is a store whose Complete fails while down is set, or,
// with lose set, reaches the store beneath and then loses its answer. It
// counts the Complete calls.
type failingCompletes struct {
	idempotency.Store
	down, lose atomic.Bool
	calls      atomic.Int64
}

func (s *failingCompletes) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	s.calls.Add(1)
	if s.down.Load() {
		return errors.New("connection refused")
	}
	if s.lose.CompareAndSwap(true, false) {
		if err := s.Store.Complete(ctx, scope, key, owner, response, retention); err != nil {
			return err
		}
		return errors.New("connection reset")
	}
	return s.Store.Complete(ctx, scope, key, owner, response, retention)
}

// runsOnce calls Do twice with key k and checks that fn ran once and the
// second call replayed the first's result.
func runsOnce(t *testing.T, e *idempotency.Executor, k string, first error) {
	t.Helper()
	var runs atomic.Int64
	fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("order 7"), nil }
	res, err := e.Do(context.Background(), k, "fp", fn)
	if !errors.Is(err, first) || string(res.Response) != "order 7" {
		t.Fatalf("first Do: %q, %v; want %q, %v", res.Response, err, "order 7", first)
	}
	res, err = e.Do(context.Background(), k, "fp", fn)
	if err != nil || !res.Replayed || string(res.Response) != "order 7" {
		t.Fatalf("retry: %q replayed %v, %v; want the first result replayed", res.Response, res.Replayed, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times", n)
	}
}

// TestCompleteRidesOutOutage: a store that fails for a moment when fn has
// returned (a failover) still gets the result, so the client's retry
// replays it instead of running fn again.
func TestCompleteRidesOutOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &failingCompletes{Store: idempotency.NewMemoryStore()}
		st.down.Store(true)
		time.AfterFunc(2*time.Second, func() { st.down.Store(false) })
		e := newExecutor(t, st)
		start := time.Now()
		runsOnce(t, e, "k", nil)
		if n := st.calls.Load(); n < 3 || n > 10 {
			t.Errorf("%d Complete calls over a 2s outage; want a few, backing off", n)
		}
		t.Logf("stored after %v and %d Complete calls", time.Since(start), st.calls.Load())
	})
}

// TestCompleteAnswerLost: a Complete that landed but whose answer was lost
// is not taken for a failure: the next attempt is refused (the record is
// final), and the record, read back, is this owner's.
func TestCompleteAnswerLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &failingCompletes{Store: idempotency.NewMemoryStore()}
		st.lose.Store(true)
		e := newExecutor(t, st)
		runsOnce(t, e, "k", nil)
		if n := st.calls.Load(); n != 2 {
			t.Errorf("%d Complete calls; want 2 (the lost answer, then the refused retry)", n)
		}
	})
}

// TestCompleteOutageOutlastsBound: a store down for longer than the bound
// on finishing fails Do with ErrUnavailable after that bound, not sooner,
// with fn's bytes returned.
func TestCompleteOutageOutlastsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &failingCompletes{Store: idempotency.NewMemoryStore()}
		st.down.Store(true)
		e := newExecutor(t, st)
		start := time.Now()
		res, err := e.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) { return []byte("order 7"), nil })
		if !errors.Is(err, idempotency.ErrUnavailable) || string(res.Response) != "order 7" {
			t.Fatalf("Do: %q, %v; want fn's bytes and ErrUnavailable", res.Response, err)
		}
		if d := time.Since(start); d < 10*time.Second || d > 11*time.Second {
			t.Errorf("Do gave up after %v; want the 10s bound on finishing", d)
		}
		if n := st.calls.Load(); n < 5 || n > 25 {
			t.Errorf("%d Complete calls in 10s; want a bounded few", n)
		}
		// The completion goes on in the background until the claim's
		// lease is over, then gives up.
		time.Sleep(idempotency.DefaultLease)
		synctest.Wait()
		calls := st.calls.Load()
		time.Sleep(time.Minute)
		if n := st.calls.Load(); n != calls || n > 50 {
			t.Errorf("%d Complete calls in the claim's 30s, %d more after it; want a bounded few, and none after", calls, n-calls)
		}
	})
}

// resentCompletes is a store client that sends every Complete twice, as
// go-redis resends a command after a timeout: the first lands, the second
// is refused, and the refusal is what the caller sees.
type resentCompletes struct{ idempotency.Store }

func (s resentCompletes) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := s.Store.Complete(ctx, scope, key, owner, response, retention); err != nil {
		return err
	}
	return s.Store.Complete(ctx, scope, key, owner, response, retention)
}

// TestCompleteResentByClient: a first Complete refused because the client
// resent it after it landed is read back and taken for the success it was.
func TestCompleteResentByClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newExecutor(t, resentCompletes{idempotency.NewMemoryStore()})
		runsOnce(t, e, "k", nil)
	})
}

// TestCompleteRetriesEndWithClaim: with a lease shorter than the bound on
// finishing, a store that stays down is not asked again past the claim's
// life, when no answer but a refusal could come.
func TestCompleteRetriesEndWithClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &failingCompletes{Store: idempotency.NewMemoryStore()}
		st.down.Store(true)
		e := newExecutor(t, st, idempotency.WithLease(1500*time.Millisecond))
		start := time.Now()
		if _, err := e.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idempotency.ErrUnavailable) {
			t.Fatalf("Do: %v, want ErrUnavailable", err)
		}
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Errorf("Do gave up after %v, past the 1.5s lease", d)
		}
	})
}

// TestCompleteOfRemovedRecord: a record removed while fn ran (an operator's
// Delete) is not waited for: the refused Complete reads no record back, and
// Do reports the result not stored at once.
func TestCompleteOfRemovedRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := idempotency.NewMemoryStore()
		e, err := idempotency.New(st)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = e.Do(context.Background(), "k", "fp", func(ctx context.Context) ([]byte, error) {
			if err := st.Delete(ctx, "", "k", ""); err != nil {
				t.Errorf("Delete: %v", err)
			}
			return []byte("order 7"), nil
		})
		if !errors.Is(err, idempotency.ErrNotOwner) {
			t.Fatalf("Do: %v, want ErrNotOwner", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Do returned after %v, want at once", d)
		}
	})
}

// TestCompleteOutageWithinLease: a store down for longer than the caller
// waits (ten seconds) but back within the claim's lease still gets the
// result, stored in the background while the claim may be held: the
// client's retry, once the store is back, replays it rather than find the
// key in progress until the claim runs out and then run fn a second time.
func TestCompleteOutageWithinLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &failingCompletes{Store: idempotency.NewMemoryStore()}
		st.down.Store(true)
		time.AfterFunc(15*time.Second, func() { st.down.Store(false) })
		e := newExecutor(t, st) // the default 30s lease
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("order 7"), nil }
		start := time.Now()
		if _, err := e.Do(context.Background(), "k", "fp", fn); !errors.Is(err, idempotency.ErrUnavailable) {
			t.Fatalf("first Do: %v, want ErrUnavailable once the caller stopped waiting", err)
		}
		time.Sleep(time.Until(start.Add(20 * time.Second)))
		res, err := e.Do(context.Background(), "k", "fp", fn)
		if err != nil || !res.Replayed || string(res.Response) != "order 7" || runs.Load() != 1 {
			t.Errorf("retry 20s after the first call, the store back for 5s: %q replayed %v, %v after %d runs; want the first result replayed",
				res.Response, res.Replayed, err, runs.Load())
		}
	})
}

// A store down for the whole of the claim's life: the background
// completion gives up when the claim runs out, and says so (the caller
// heard only that the store failed), so that the retry's second run of fn
// is explained in the log.
func TestCompleteOutageOutlastsLeaseIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &failingCompletes{Store: idempotency.NewMemoryStore()}
		st.down.Store(true)
		var log drivertest.LogBuffer
		e := newExecutor(t, st, idempotency.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
		fn := func(context.Context) ([]byte, error) { return []byte("order 7"), nil }
		if _, err := e.Do(context.Background(), "k", "fp", fn); !errors.Is(err, idempotency.ErrUnavailable) {
			t.Fatalf("Do: %v, want ErrUnavailable", err)
		}
		time.Sleep(time.Minute) // past the default 30s lease
		synctest.Wait()
		if s := log.String(); !strings.Contains(s, "level=ERROR") || !strings.Contains(s, "result lost") {
			t.Errorf("log after the claim ran out:\n%s\nwant an ERROR saying the result was lost", s)
		}
	})
}

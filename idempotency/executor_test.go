package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/idempotency"
)

// patience bounds every wait on a condition: reaching it means the behaviour
// is wrong, not slow.
const patience = 20 * time.Second

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", patience, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newExecutor returns an Executor over st that keeps no idle goroutines,
// which would outlive a testing/synctest bubble.
func newExecutor(t *testing.T, st idempotency.Store, opts ...idempotency.Option) *idempotency.Executor {
	t.Helper()
	e, err := idempotency.New(st, append([]idempotency.Option{idempotency.WithIdleCallers(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// counted returns a Func that counts its runs and returns body.
func counted(n *atomic.Int64, body string) idempotency.Func {
	return func(context.Context) ([]byte, error) {
		n.Add(1)
		return []byte(body), nil
	}
}

func TestDoRunsOnceAndReplays(t *testing.T) {
	e := newExecutor(t, idempotency.NewMemoryStore())
	ctx := context.Background()
	var runs atomic.Int64
	first, err := e.Do(ctx, "k", "fp", counted(&runs, "result"))
	if err != nil || first.Replayed || string(first.Response) != "result" {
		t.Fatalf("first call: (%+v, %v)", first, err)
	}
	for range 3 {
		again, err := e.Do(ctx, "k", "fp", counted(&runs, "other"))
		if err != nil || !again.Replayed || string(again.Response) != "result" {
			t.Fatalf("repeat: (%q, replayed %v, %v), want the stored result replayed", again.Response, again.Replayed, err)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("fn ran %d times, want 1", runs.Load())
	}
	if _, err := e.Do(ctx, "k", "another request", counted(&runs, "x")); !errors.Is(err, idempotency.ErrFingerprintMismatch) {
		t.Errorf("different fingerprint: got %v, want ErrFingerprintMismatch", err)
	}
	// Scopes are separate key spaces.
	for _, scope := range []string{"alice", "bob"} {
		res, err := e.Do(ctx, "k", "fp", counted(&runs, scope), idempotency.WithScope(scope))
		if err != nil || res.Replayed || string(res.Response) != scope {
			t.Errorf("scope %s: (%q, replayed %v, %v), want a fresh run", scope, res.Response, res.Replayed, err)
		}
	}
}

// blocker is a Func that runs until released, so that duplicates are sure
// to arrive while it is in progress.
type blocker struct {
	started chan struct{}
	release chan struct{}
	runs    atomic.Int64
}

func newBlocker() *blocker {
	return &blocker{started: make(chan struct{}), release: make(chan struct{})}
}

func (b *blocker) fn(ctx context.Context) ([]byte, error) {
	if b.runs.Add(1) == 1 {
		close(b.started)
	}
	select {
	case <-b.release:
		return []byte("done"), nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func TestDoConcurrentDuplicates(t *testing.T) {
	e := newExecutor(t, idempotency.NewMemoryStore())
	ctx := context.Background()
	b := newBlocker()
	firstDone := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, "k", "fp", b.fn)
		firstDone <- err
	}()
	<-b.started

	const n = 32
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, errs[i] = e.Do(ctx, "k", "fp", b.fn) })
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, idempotency.ErrInProgress) {
			t.Errorf("duplicate %d while in progress: got %v, want ErrInProgress", i, err)
		}
	}
	// A bounded wait that runs out still gets ErrInProgress.
	if _, err := e.Do(ctx, "k", "fp", b.fn, idempotency.WithWait(30*time.Millisecond)); !errors.Is(err, idempotency.ErrInProgress) {
		t.Errorf("wait that ran out: got %v, want ErrInProgress", err)
	}

	// Waiters get the first call's result once it finishes.
	waited := make([]idempotency.Result, n)
	for i := range n {
		wg.Go(func() { waited[i], errs[i] = e.Do(ctx, "k", "fp", b.fn, idempotency.WithWait(patience)) })
	}
	close(b.release)
	wg.Wait()
	if err := <-firstDone; err != nil {
		t.Fatalf("first call: %v", err)
	}
	for i := range n {
		if errs[i] != nil || !waited[i].Replayed || string(waited[i].Response) != "done" {
			t.Errorf("waiter %d: (%q, replayed %v, %v), want the replayed result", i, waited[i].Response, waited[i].Replayed, errs[i])
		}
	}
	if got := b.runs.Load(); got != 1 {
		t.Errorf("fn ran %d times, want 1", got)
	}
}

func TestDoErrorPolicy(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	failing := func(context.Context) ([]byte, error) { return []byte("partial"), boom }

	t.Run("ReleaseByDefault", func(t *testing.T) {
		e := newExecutor(t, idempotency.NewMemoryStore())
		if _, err := e.Do(ctx, "k", "fp", failing); !errors.Is(err, boom) {
			t.Fatalf("got %v, want fn's error", err)
		}
		var runs atomic.Int64
		res, err := e.Do(ctx, "k", "fp", counted(&runs, "retried"))
		if err != nil || res.Replayed || runs.Load() != 1 {
			t.Errorf("retry after an error: (%+v, %v), ran %d times; want a fresh run", res, err, runs.Load())
		}
	})
	t.Run("Keep", func(t *testing.T) {
		e := newExecutor(t, idempotency.NewMemoryStore(), idempotency.WithErrorPolicy(func(err error) idempotency.Action {
			if errors.Is(err, boom) {
				return idempotency.Keep
			}
			return idempotency.Release
		}))
		if _, err := e.Do(ctx, "k", "fp", failing); !errors.Is(err, boom) {
			t.Fatalf("got %v, want fn's error", err)
		}
		var runs atomic.Int64
		res, err := e.Do(ctx, "k", "fp", counted(&runs, "not run"))
		if !errors.Is(err, idempotency.ErrStoredFailure) || err.Error() != idempotency.ErrStoredFailure.Error()+": boom" {
			t.Errorf("replay of a kept failure: got %v, want ErrStoredFailure with the message", err)
		}
		if !res.Replayed || string(res.Response) != "partial" || runs.Load() != 0 {
			t.Errorf("replay of a kept failure: (%+v), ran %d times", res, runs.Load())
		}
	})
}

func TestDoPanicReleasesAndRepanics(t *testing.T) {
	e := newExecutor(t, idempotency.NewMemoryStore())
	ctx := context.Background()
	func() {
		defer func() {
			if r := recover(); r != "handler bug" {
				t.Errorf("recovered %v, want the fn's own panic value", r)
			}
		}()
		e.Do(ctx, "k", "fp", func(context.Context) ([]byte, error) { panic("handler bug") })
		t.Error("Do returned after fn panicked")
	}()
	var runs atomic.Int64
	if res, err := e.Do(ctx, "k", "fp", counted(&runs, "ok")); err != nil || res.Replayed || runs.Load() != 1 {
		t.Errorf("after a panic: (%+v, %v), ran %d times; want a fresh run", res, err, runs.Load())
	}
}

// TestDoWatchdogKeepsLongWork: fn outlives several leases; the watchdog
// keeps its claim, so a duplicate never runs it a second time.
func TestDoWatchdogKeepsLongWork(t *testing.T) {
	const lease = 300 * time.Millisecond
	st := idempotency.NewMemoryStore()
	e := newExecutor(t, st, idempotency.WithLease(lease))
	ctx := context.Background()
	var runs atomic.Int64
	fn := func(ctx context.Context) ([]byte, error) {
		runs.Add(1)
		// A control claim with the same lease, taken after ours and never
		// renewed: once the store has expired it, ours would have expired
		// too without the watchdog. Wait for three of them in a row.
		for i := range 3 {
			control := fmt.Sprintf("control-%d", i)
			if rec, err := st.Claim(ctx, idempotency.Claim{Key: control, Owner: "control", Lease: lease}); rec != nil || err != nil {
				return nil, fmt.Errorf("control claim: %v, %v", rec, err)
			}
			eventually(t, "the control claim expires", func() bool {
				_, err := st.Get(ctx, "", control)
				return errors.Is(err, idempotency.ErrNotFound)
			})
			if _, err := e.Do(ctx, "k", "fp", counted(&runs, "dup")); !errors.Is(err, idempotency.ErrInProgress) {
				return nil, fmt.Errorf("duplicate after %d leases: %v, want ErrInProgress", i+1, err)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("fn's context ended while its claim was renewed: %v", context.Cause(ctx))
		}
		return []byte("long"), nil
	}
	if _, err := e.Do(ctx, "k", "fp", fn); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 {
		t.Errorf("fn ran %d times, want 1", runs.Load())
	}
}

// flakyExtend is the memory store as seen by an owner cut off from it: its
// renewals fail, everything else goes through.
type flakyExtend struct{ idempotency.Store }

func (flakyExtend) Extend(context.Context, string, string, string, time.Duration) error {
	return fmt.Errorf("%w: connection refused", idempotency.ErrUnavailable)
}

// TestDoLostClaim: an owner that cannot renew loses its claim once the lease
// runs out; its context is cancelled with ErrNotOwner, a retry runs, and the
// stale owner's late result is refused without touching the retry's.
func TestDoLostClaim(t *testing.T) {
	const lease = 300 * time.Millisecond
	st := idempotency.NewMemoryStore()
	stale := newExecutor(t, flakyExtend{st}, idempotency.WithLease(lease))
	retry := newExecutor(t, st, idempotency.WithLease(lease))
	ctx := context.Background()

	staleCtx := make(chan context.Context, 1)
	finish := make(chan struct{})
	staleDone := make(chan struct{})
	var staleRes idempotency.Result
	var staleErr error
	go func() {
		defer close(staleDone)
		staleRes, staleErr = stale.Do(ctx, "k", "fp", func(ctx context.Context) ([]byte, error) {
			staleCtx <- ctx
			<-finish // goes on working although told: a handler that ignores its context
			return []byte("stale"), nil
		})
	}()
	sctx := <-staleCtx

	var runs atomic.Int64
	eventually(t, "the stale claim expires and the retry runs", func() bool {
		res, err := retry.Do(ctx, "k", "fp", counted(&runs, "fresh"))
		if errors.Is(err, idempotency.ErrInProgress) {
			return false
		}
		if err != nil || res.Replayed || string(res.Response) != "fresh" {
			t.Fatalf("retry: (%+v, %v), want a fresh run", res, err)
		}
		return true
	})
	eventually(t, "the stale owner's context is cancelled", func() bool { return sctx.Err() != nil })
	if cause := context.Cause(sctx); !errors.Is(cause, idempotency.ErrNotOwner) {
		t.Errorf("stale owner's context cause: %v, want ErrNotOwner", cause)
	}
	close(finish)
	<-staleDone
	if !errors.Is(staleErr, idempotency.ErrNotOwner) || string(staleRes.Response) != "stale" {
		t.Errorf("stale owner's Do: (%q, %v), want its own bytes and ErrNotOwner", staleRes.Response, staleErr)
	}
	res, err := retry.Do(ctx, "k", "fp", counted(&runs, "third"))
	if err != nil || !res.Replayed || string(res.Response) != "fresh" || runs.Load() != 1 {
		t.Errorf("after the stale completion: (%q, replayed %v, %v), runs %d; want the retry's result", res.Response, res.Replayed, err, runs.Load())
	}
}

// TestDoCrashedOwner: a claim whose owner vanished blocks the key only until
// its lease runs out.
func TestDoCrashedOwner(t *testing.T) {
	st := idempotency.NewMemoryStore()
	ctx := context.Background()
	if rec, err := st.Claim(ctx, idempotency.Claim{Key: "k", Fingerprint: "fp", Owner: "crashed", Lease: 300 * time.Millisecond}); rec != nil || err != nil {
		t.Fatal(rec, err)
	}
	e := newExecutor(t, st)
	var runs atomic.Int64
	eventually(t, "the crashed owner's lease runs out", func() bool {
		_, err := e.Do(ctx, "k", "fp", counted(&runs, "ok"))
		if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatal(err)
		}
		return err == nil
	})
	if runs.Load() != 1 {
		t.Errorf("fn ran %d times, want 1", runs.Load())
	}
}

func TestDoRetention(t *testing.T) {
	e := newExecutor(t, idempotency.NewMemoryStore(), idempotency.WithRetention(200*time.Millisecond))
	ctx := context.Background()
	var runs atomic.Int64
	if _, err := e.Do(ctx, "k", "fp", counted(&runs, "a")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the result's retention runs out and fn runs again", func() bool {
		res, err := e.Do(ctx, "k", "fp", counted(&runs, "a"))
		if err != nil {
			t.Fatal(err)
		}
		return !res.Replayed
	})
	if runs.Load() != 2 {
		t.Errorf("fn ran %d times, want 2", runs.Load())
	}
}

func TestDoInvalid(t *testing.T) {
	if _, err := idempotency.New(nil); !errors.Is(err, idempotency.ErrInvalid) {
		t.Errorf("New(nil): %v", err)
	}
	st := idempotency.NewMemoryStore()
	// Each bad option is refused where it is given, with an error naming it.
	for _, tc := range []struct {
		name string
		opt  idempotency.Option
		want string
	}{
		{"zero lease", idempotency.WithLease(0), "WithLease"},
		{"2ns lease", idempotency.WithLease(2), "WithLease"},
		{"microsecond lease", idempotency.WithLease(999 * time.Microsecond), "WithLease"},
		{"zero retention", idempotency.WithRetention(0), "WithRetention"},
		{"nanosecond retention", idempotency.WithRetention(time.Nanosecond), "WithRetention"},
		{"negative wait", idempotency.WithWait(-1), "WithWait"},
		{"microsecond wait", idempotency.WithWait(time.Microsecond), "WithWait"},
		{"nil policy", idempotency.WithErrorPolicy(nil), "WithErrorPolicy"},
		{"nil logger", idempotency.WithLogger(nil), "WithLogger"},
		{"nil tracer", idempotency.WithTracerProvider(nil), "WithTracerProvider"},
		{"nil meter", idempotency.WithMeterProvider(nil), "WithMeterProvider"},
		{"nil option", nil, "nil Option"},
		{"reserved scope", idempotency.WithScope(idempotency.ReservedScopePrefix + "scheduler"), "WithScope"},
	} {
		if _, err := idempotency.New(st, tc.opt); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %s: %v, want ErrInvalid naming %s", tc.name, err, tc.want)
		}
		e := newExecutor(t, st)
		var runs atomic.Int64
		if _, err := e.Do(context.Background(), "k-"+tc.name, "fp", counted(&runs, ""), tc.opt); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Do with %s: %v, want ErrInvalid naming %s", tc.name, err, tc.want)
		}
		if runs.Load() != 0 {
			t.Errorf("Do with %s ran fn", tc.name)
		}
	}
	if _, err := idempotency.New(st, idempotency.WithLease(time.Millisecond), idempotency.WithWait(time.Millisecond)); err != nil {
		t.Errorf("the minimum lease and wait: %v", err)
	}
	e := newExecutor(t, st)
	ctx := context.Background()
	var runs atomic.Int64
	var nilCtx context.Context
	for name, call := range map[string]func() error{
		"empty key": func() error { _, err := e.Do(ctx, "", "fp", counted(&runs, "")); return err },
		"nil fn":    func() error { _, err := e.Do(ctx, "k", "fp", nil); return err },
		"nil ctx":   func() error { _, err := e.Do(nilCtx, "k", "fp", counted(&runs, "")); return err },
	} {
		if err := call(); !errors.Is(err, idempotency.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
	if runs.Load() != 0 {
		t.Errorf("fn ran %d times on invalid calls", runs.Load())
	}
}

// TestDoNotReplayable: a result that cannot be kept still completes the
// key: its repeats get ErrNotReplayable and fn never runs again.
func TestDoNotReplayable(t *testing.T) {
	e := newExecutor(t, idempotency.NewMemoryStore(), idempotency.WithErrorPolicy(func(error) idempotency.Action { return idempotency.Release }))
	ctx := context.Background()
	var runs atomic.Int64
	for _, tc := range []struct {
		name    string
		fn      idempotency.Func
		summary string
	}{
		{"result over the limit", func(context.Context) ([]byte, error) {
			runs.Add(1)
			return make([]byte, idempotency.MaxResultLen+1), nil
		}, ""},
		{"result at the limit", func(context.Context) ([]byte, error) {
			runs.Add(1)
			return make([]byte, idempotency.MaxResultLen), nil
		}, ""},
		{"fn says so", func(context.Context) ([]byte, error) {
			runs.Add(1)
			return []byte("status 200, streamed"), fmt.Errorf("streamed: %w", idempotency.ErrNotReplayable)
		}, "status 200, streamed"},
	} {
		runs.Store(0)
		first, err := e.Do(ctx, tc.name, "fp", tc.fn)
		if first.Replayed {
			t.Errorf("%s: first call replayed", tc.name)
		}
		again, againErr := e.Do(ctx, tc.name, "fp", tc.fn)
		if tc.name == "result at the limit" {
			if err != nil || againErr != nil || !again.Replayed || len(again.Response) != idempotency.MaxResultLen {
				t.Errorf("%s: (%v) then (%d bytes, replayed %v, %v), want the result replayed", tc.name, err, len(again.Response), again.Replayed, againErr)
			}
		} else if !errors.Is(againErr, idempotency.ErrNotReplayable) || !again.Replayed || string(again.Response) != tc.summary {
			t.Errorf("%s: repeat got (%.40q, replayed %v, %v), want ErrNotReplayable with %q", tc.name, again.Response, again.Replayed, againErr, tc.summary)
		}
		if runs.Load() != 1 {
			t.Errorf("%s: fn ran %d times, want 1", tc.name, runs.Load())
		}
	}
}

// TestDoCallerGoneStillStored: a caller that gives up while fn runs does
// not free the key: fn's result is stored and replayed to the retry.
func TestDoCallerGoneStillStored(t *testing.T) {
	e := newExecutor(t, idempotency.NewMemoryStore())
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int64
	res, err := e.Do(ctx, "k", "fp", func(fctx context.Context) ([]byte, error) {
		runs.Add(1)
		cancel()
		<-fctx.Done()
		return []byte("done anyway"), nil
	})
	if err != nil || string(res.Response) != "done anyway" {
		t.Fatalf("Do whose caller left: (%q, %v)", res.Response, err)
	}
	again, err := e.Do(context.Background(), "k", "fp", counted(&runs, "second"))
	if err != nil || !again.Replayed || string(again.Response) != "done anyway" || runs.Load() != 1 {
		t.Errorf("retry: (%q, replayed %v, %v), runs %d; want the first result replayed", again.Response, again.Replayed, err, runs.Load())
	}
}

// TestLongFingerprintStoredAsHash: a fingerprint past MaxFingerprintLen is
// stored as its hash, and a literal fingerprint spelling that hash (the
// stored form, which a caller could send) is not taken for it: the same key
// with it is another request.
func TestLongFingerprintStoredAsHash(t *testing.T) {
	st := idempotency.NewMemoryStore()
	e := newExecutor(t, st)
	ctx := context.Background()
	var runs atomic.Int64
	long := strings.Repeat("body ", idempotency.MaxFingerprintLen)
	if _, err := e.Do(ctx, "k", long, counted(&runs, "result")); err != nil {
		t.Fatal(err)
	}
	rec, err := st.Get(ctx, "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Fingerprint) > idempotency.MaxFingerprintLen || rec.Fingerprint == long {
		t.Fatalf("stored fingerprint of %d bytes, want a hash of the %d given", len(rec.Fingerprint), len(long))
	}
	if _, err := e.Do(ctx, "k", rec.Fingerprint, counted(&runs, "other")); !errors.Is(err, idempotency.ErrFingerprintMismatch) {
		t.Errorf("the stored form given as a fingerprint: %v, want ErrFingerprintMismatch", err)
	}
	if res, err := e.Do(ctx, "k", long, counted(&runs, "other")); err != nil || !res.Replayed || string(res.Response) != "result" {
		t.Errorf("repeat: (%q, replayed %v, %v), want the result replayed", res.Response, res.Replayed, err)
	}
	if runs.Load() != 1 {
		t.Errorf("ran %d times, want 1", runs.Load())
	}
}

// TestLongFingerprintOfAnEarlierRelease: a record an earlier release wrote
// keeps a long fingerprint as it is; a retry of that request, whose claim
// carries the fingerprint's hash, gets the stored result, not
// ErrFingerprintMismatch (422 through httpmw) during a rolling upgrade.
func TestLongFingerprintOfAnEarlierRelease(t *testing.T) {
	long := strings.Repeat("body ", idempotency.MaxFingerprintLen)
	st := &earlierRecords{Store: idempotency.NewMemoryStore(), raw: long}
	e := newExecutor(t, st)
	ctx := context.Background()
	var runs atomic.Int64
	if _, err := e.Do(ctx, "k", long, counted(&runs, "result")); err != nil {
		t.Fatal(err)
	}
	res, err := e.Do(ctx, "k", long, counted(&runs, "other"))
	if err != nil || !res.Replayed || string(res.Response) != "result" {
		t.Errorf("repeat over a record of an earlier release: (%q, replayed %v, %v), want the result replayed", res.Response, res.Replayed, err)
	}
	if runs.Load() != 1 {
		t.Errorf("ran %d times, want 1", runs.Load())
	}
}

// earlierRecords shows the records of a store as a release before
// fingerprints were hashed wrote them: a long fingerprint, raw, as it is.
type earlierRecords struct {
	idempotency.Store
	raw string
}

func (s *earlierRecords) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	rec, err := s.Store.Claim(ctx, c)
	if rec != nil && len(rec.Fingerprint) != len(s.raw) {
		rec.Fingerprint = s.raw
	}
	return rec, err
}

package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/idempotency"
)

// grace is how long past its bound a store call may run before the
// Executor answers for it (idempotency's grace).
const grace = 20 * time.Millisecond

// hung is a store whose calls named in ops ignore their context and answer
// only after a minute, as go-redis with its default options does for a
// server that stopped answering (it waits out its read timeout, then sends
// again), or any client on a black-holed connection. The call reaches the
// store beneath when it answers, or, for a claim with early set, at once.
// It counts the calls not yet answered.
type hung struct {
	idempotency.Store
	ops      string // "claim", "get", "complete", "extend", "abandon", space-separated
	early    bool
	inflight atomic.Int64
}

const hangFor = time.Minute

func (s *hung) hang(op string) bool {
	if !strings.Contains(" "+s.ops+" ", " "+op+" ") {
		return false
	}
	s.inflight.Add(1)
	return true
}

func (s *hung) answer() {
	time.Sleep(hangFor)
	s.inflight.Add(-1)
}

func (s *hung) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if !s.hang("claim") {
		return s.Store.Claim(ctx, c)
	}
	if s.early {
		rec, err := s.Store.Claim(ctx, c)
		s.answer()
		return rec, err
	}
	s.answer()
	return s.Store.Claim(context.WithoutCancel(ctx), c)
}

func (s *hung) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if s.hang("get") {
		s.answer()
	}
	return s.Store.Get(context.WithoutCancel(ctx), scope, key)
}

func (s *hung) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if s.hang("complete") {
		s.answer()
	}
	return s.Store.Complete(context.WithoutCancel(ctx), scope, key, owner, response, retention)
}

func (s *hung) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	if s.hang("extend") {
		s.answer()
	}
	return s.Store.Extend(context.WithoutCancel(ctx), scope, key, owner, lease)
}

func (s *hung) Abandon(ctx context.Context, scope, key, owner string) error {
	if s.hang("abandon") {
		s.answer()
	}
	return s.Store.Abandon(context.WithoutCancel(ctx), scope, key, owner)
}

// settled waits until every hung call has answered and what it started
// (a give-back, a completion going on in the background for as long as
// the claim's default lease) has ended: the bubble then holds no goroutine
// of the Executor's but those of the test, or synctest.Test fails.
func (s *hung) settled(t *testing.T) {
	t.Helper()
	time.Sleep(idempotency.DefaultLease + hangFor + 5*time.Second)
	synctest.Wait()
	if n := s.inflight.Load(); n != 0 {
		t.Errorf("%d store calls still unanswered", n)
	}
}

// TestClaimBounded: a claim the store does not answer is answered
// ErrUnavailable within the call timeout and its grace, whatever the
// store's client does with its context, and fn does not run; the claim,
// made at once or landing when its answer comes a minute later, is given
// back then, so the key is free for a retry.
func TestClaimBounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		early bool
		opts  []idempotency.Option
		bound time.Duration
	}{
		{"made late/default timeout", false, nil, idempotency.DefaultCallTimeout},
		{"made at once/1s", true, []idempotency.Option{idempotency.WithCallTimeout(time.Second)}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := idempotency.NewMemoryStore()
				st := &hung{Store: mem, ops: "claim", early: tc.early}
				e := newExecutor(t, st, tc.opts...)
				var runs atomic.Int64
				start := time.Now()
				_, err := e.Do(context.Background(), "k", "fp", counted(&runs, "x"))
				if d := time.Since(start); !errors.Is(err, idempotency.ErrUnavailable) || d > tc.bound+grace {
					t.Fatalf("Do with the claim unanswered: %v after %v, want ErrUnavailable within %v", err, d, tc.bound+grace)
				}
				st.settled(t)
				if runs.Load() != 0 {
					t.Fatal("fn ran on a claim answered after its caller gave up")
				}
				if rec, err := mem.Get(context.Background(), "", "k"); !errors.Is(err, idempotency.ErrNotFound) {
					t.Fatalf("the late claim was not given back: %+v, %v", rec, err)
				}
				st.ops = ""
				if res, err := e.Do(context.Background(), "k", "fp", counted(&runs, "x")); err != nil || res.Replayed || runs.Load() != 1 {
					t.Errorf("retry: %+v, %v, %d runs; want fn run once", res, err, runs.Load())
				}
			})
		})
	}
}

// TestClaimBoundedByCallerDeadline: a caller's deadline sooner than the
// call timeout is the bound; the caller gets its context's error.
func TestClaimBoundedByCallerDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &hung{Store: idempotency.NewMemoryStore(), ops: "claim"}
		e := newExecutor(t, st)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := e.Do(ctx, "k", "fp", func(context.Context) ([]byte, error) { t.Error("fn ran"); return nil, nil })
		if d := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || d > 300*time.Millisecond+grace {
			t.Errorf("Do: %v after %v, want the caller's deadline within %v", err, d, 300*time.Millisecond+grace)
		}
		st.settled(t)
	})
}

// TestCompleteBounded: a completion (or its read-back) the store does not
// answer holds the caller for no longer than the bound on finishing (10 s,
// each call within the call timeout): Do then returns fn's bytes with
// ErrUnavailable, the result not stored, as for a store that fails.
func TestCompleteBounded(t *testing.T) {
	for _, ops := range []string{"complete", "get"} {
		t.Run(ops, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := idempotency.NewMemoryStore()
				var st idempotency.Store = &hung{Store: mem, ops: ops}
				if ops == "get" {
					// Each completion lands and is refused as sent again, so
					// that only the read-back can say it landed.
					st = resentCompletes{st}
				}
				e := newExecutor(t, st, idempotency.WithCallTimeout(time.Second))
				var returned time.Time
				res, err := e.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) {
					returned = time.Now()
					return []byte("order 7"), nil
				})
				if d := time.Since(returned); !errors.Is(err, idempotency.ErrUnavailable) || string(res.Response) != "order 7" || d > 10*time.Second+grace {
					t.Errorf("Do: %q, %v, %v after fn returned; want fn's bytes and ErrUnavailable within %v", res.Response, err, d, 10*time.Second+grace)
				}
				if err != nil && !strings.Contains(err.Error(), "no answer") {
					t.Errorf("Do: %v, want an error that says the store gave no answer", err)
				}
				st.(interface{ settled(*testing.T) }).settled(t)
			})
		})
	}
}

func (s resentCompletes) settled(t *testing.T) { s.Store.(*hung).settled(t) }

// TestRenewalBounded: a renewal the store does not answer does not hold
// the caller once fn returns for longer than the renewal's bound (the call
// timeout, or the renewal period when shorter) and its grace, and fn is
// still told a tenth of the lease before the claim could run out
// unrenewed.
func TestRenewalBounded(t *testing.T) {
	const lease = 30 * time.Second // renewals every 10 s, each bounded by the 5 s call timeout
	t.Run("fn returns", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := &hung{Store: idempotency.NewMemoryStore(), ops: "extend"}
			e := newExecutor(t, st, idempotency.WithLease(lease))
			start := time.Now()
			res, err := e.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) {
				time.Sleep(12 * time.Second) // the renewal sent at 10 s hangs
				return []byte("x"), nil
			})
			if d := time.Since(start); err != nil || string(res.Response) != "x" || d > 10*time.Second+idempotency.DefaultCallTimeout+grace {
				t.Errorf("Do: %q, %v after %v; want fn's result within %v", res.Response, err, d, 10*time.Second+idempotency.DefaultCallTimeout+grace)
			}
			st.settled(t)
		})
	})
	t.Run("told in time", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := &hung{Store: idempotency.NewMemoryStore(), ops: "extend"}
			e := newExecutor(t, st, idempotency.WithLease(lease))
			start := time.Now()
			toldAtMargin(t, e, lease)
			if d := time.Since(start); d > lease-lease/10+idempotency.DefaultCallTimeout+grace {
				t.Errorf("Do returned after %v", d)
			}
			st.settled(t)
		})
	})
}

// TestAbandonBounded: an error the policy releases the claim for returns
// to the caller within the call timeout and its grace when the store does
// not answer the release; the release lands in the background when the
// store answers.
func TestAbandonBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := idempotency.NewMemoryStore()
		st := &hung{Store: mem, ops: "abandon"}
		e := newExecutor(t, st, idempotency.WithCallTimeout(time.Second))
		boom := errors.New("boom")
		var returned time.Time
		_, err := e.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) {
			returned = time.Now()
			return nil, boom
		})
		if d := time.Since(returned); !errors.Is(err, boom) || d > time.Second+grace {
			t.Errorf("Do: %v after %v, want fn's error within %v", err, d, time.Second+grace)
		}
		st.settled(t)
		if _, err := mem.Get(context.Background(), "", "k"); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("the release did not land: %v", err)
		}
	})
}

// TestCallTimeoutValidated: a call timeout shorter than MinDuration (a
// unit slip: 2 is two nanoseconds) or negative is refused, named, as is a
// negative number of idle callers.
func TestCallTimeoutValidated(t *testing.T) {
	for _, d := range []time.Duration{2, -time.Second, 0} {
		_, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.WithCallTimeout(d))
		if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "WithCallTimeout") {
			t.Errorf("WithCallTimeout(%v): %v, want ErrInvalid naming WithCallTimeout", d, err)
		}
	}
	if _, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.WithCallTimeout(idempotency.MinDuration)); err != nil {
		t.Errorf("WithCallTimeout(MinDuration): %v", err)
	}
	if _, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.WithIdleCallers(-1)); !errors.Is(err, idempotency.ErrInvalid) ||
		!strings.Contains(err.Error(), "WithIdleCallers") {
		t.Errorf("WithIdleCallers(-1): %v, want ErrInvalid naming WithIdleCallers", err)
	}
}

// TestIdleCallersEnd: the goroutines an Executor keeps for its calls to a
// store that does not declare ContextBounded end once idle for a second:
// the bubble, which fails its test while any is left, ends.
func TestIdleCallersEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &hung{Store: idempotency.NewMemoryStore()}
		e, err := idempotency.New(st)
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		for i := range 20 {
			if _, err := e.Do(context.Background(), "k"+strings.Repeat("x", i), "fp", counted(&runs, "x")); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second + grace)
	})
}

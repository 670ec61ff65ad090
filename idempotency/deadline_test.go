package idempotency_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/idempotency"
)

// deadlineStore is the memory store behind a client that honours its
// context's deadline but not its cancellation, as go-redis does with
// ContextTimeoutEnabled: while hung, a call returns at its ctx's deadline
// and not before, whatever else ends ctx. It declares
// idempotency.DeadlineBounded, and records for each operation whether its
// latest call ran on a goroutine of the Executor's hand-off.
type deadlineStore struct {
	idempotency.Store
	hung atomic.Bool

	mu       sync.Mutex
	handedOn map[string]bool
}

func (s *deadlineStore) BoundedByDeadline() bool { return true }

func (s *deadlineStore) enter(ctx context.Context, op string) error {
	buf := make([]byte, 16<<10)
	stack := string(buf[:runtime.Stack(buf, false)])
	s.mu.Lock()
	s.handedOn[op] = strings.Contains(stack, "internal/handoff")
	s.mu.Unlock()
	if !s.hung.Load() {
		return nil
	}
	end, ok := ctx.Deadline()
	if !ok {
		return errors.New("a call with no deadline on a hung connection would never return")
	}
	time.Sleep(time.Until(end))
	return errors.Join(idempotency.ErrUnavailable, os.ErrDeadlineExceeded)
}

// handedOff reports whether the latest call of op ran on a hand-off
// goroutine, and whether there was one.
func (s *deadlineStore) handedOff(op string) (handed, made bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	handed, made = s.handedOn[op]
	return handed, made
}

// Claim makes the claim at once; while hung, its answer is lost, and the
// call ends at its deadline.
func (s *deadlineStore) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	rec, err := s.Store.Claim(ctx, c)
	if err := s.enter(ctx, "claim"); err != nil {
		return nil, err
	}
	return rec, err
}

func (s *deadlineStore) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := s.enter(ctx, "complete"); err != nil {
		return err
	}
	return s.Store.Complete(ctx, scope, key, owner, response, retention)
}

func (s *deadlineStore) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	if err := s.enter(ctx, "extend"); err != nil {
		return err
	}
	return s.Store.Extend(ctx, scope, key, owner, lease)
}

// TestDeadlineBoundedStore: a store bounded by its context's deadline is
// called on the caller's goroutine where only a deadline can end the call
// (the completion and the renewals, detached from the caller's context; a
// claim under a context with no cancellation), and still within the call timeout when it
// hangs; a claim under a context that can be cancelled is handed off, so
// that a cancellation ends it at once, which such a store would not.
func TestDeadlineBoundedStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := idempotency.NewMemoryStore()
		st := &deadlineStore{Store: mem, handedOn: map[string]bool{}}
		e := newExecutor(t, st, idempotency.WithCallTimeout(time.Second), idempotency.WithLease(3*time.Second))
		where := func(op string, wantHanded bool) {
			t.Helper()
			handed, made := st.handedOff(op)
			switch {
			case !made:
				t.Errorf("no %s reached the store", op)
			case handed != wantHanded:
				t.Errorf("%s made on a hand-off goroutine: %v, want %v", op, handed, wantHanded)
			}
		}
		var runs atomic.Int64

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if _, err := e.Do(ctx, "a", "fp", func(context.Context) ([]byte, error) {
			runs.Add(1)
			time.Sleep(2 * time.Second) // past a renewal, every third of the lease
			return []byte("x"), nil
		}); err != nil {
			t.Fatal(err)
		}
		where("claim", true)
		where("extend", false)
		where("complete", false)

		if _, err := e.Do(context.Background(), "b", "fp", counted(&runs, "x")); err != nil {
			t.Fatal(err)
		}
		where("claim", false)

		st.hung.Store(true)
		start := time.Now()
		_, err := e.Do(context.Background(), "c", "fp", counted(&runs, "x"))
		if d := time.Since(start); !errors.Is(err, idempotency.ErrUnavailable) || d > time.Second+grace {
			t.Errorf("Do, claim hung: %v after %v, want ErrUnavailable within %v", err, d, time.Second+grace)
		}
		where("claim", false)

		cctx, cancelClaim := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancelClaim)
		start = time.Now()
		_, err = e.Do(cctx, "d", "fp", counted(&runs, "x"))
		if d := time.Since(start); !errors.Is(err, context.Canceled) || d > 100*time.Millisecond+grace {
			t.Errorf("Do cancelled at 100ms, claim hung: %v after %v, want context.Canceled within %v", err, d, 100*time.Millisecond+grace)
		}
		where("claim", true)
		if n := runs.Load(); n != 2 {
			t.Errorf("fn ran %d times, want 2 (the calls whose claim was answered)", n)
		}
		// The claims whose answers were lost are given back, well within
		// their lease (3 s), which would otherwise free them too.
		st.hung.Store(false)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		for _, key := range []string{"c", "d"} {
			if rec, err := mem.Get(context.Background(), "", key); !errors.Is(err, idempotency.ErrNotFound) {
				t.Errorf("claim %s, its answer lost: %+v, %v; want it given back", key, rec, err)
			}
		}
		// The give-backs' retries, if any, end within seconds.
		time.Sleep(10 * time.Second)
		synctest.Wait()
	})
}

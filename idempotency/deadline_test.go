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

func (s *deadlineStore) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if err := s.enter(ctx, "claim"); err != nil {
		return nil, err
	}
	return s.Store.Claim(ctx, c)
}

func (s *deadlineStore) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := s.enter(ctx, "complete"); err != nil {
		return err
	}
	return s.Store.Complete(ctx, scope, key, owner, response, retention)
}

// TestDeadlineBoundedStore: a store bounded by its context's deadline is
// called on the caller's goroutine where only a deadline can end the call
// (the completion, detached from the caller's context; a claim under a
// context with no cancellation), and still within the call timeout when it
// hangs; a claim under a context that can be cancelled is handed off, so
// that a cancellation ends it at once, which such a store would not.
func TestDeadlineBoundedStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &deadlineStore{Store: idempotency.NewMemoryStore(), handedOn: map[string]bool{}}
		e := newExecutor(t, st, idempotency.WithCallTimeout(time.Second))
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
		if _, err := e.Do(ctx, "a", "fp", counted(&runs, "x")); err != nil {
			t.Fatal(err)
		}
		where("claim", true)
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
		// The claims answered after their callers left are given back,
		// with pauses of up to 2 s between tries.
		time.Sleep(10 * time.Second)
		synctest.Wait()
	})
}

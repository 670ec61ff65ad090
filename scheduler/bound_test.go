package scheduler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
)

// TestBoundedFailsFastPastMaxBehind: against a slot store that answers
// nothing and ignores its context, each call is given up at its bound and
// left running; once maxBehind are left, the next call is not made at all
// and fails at once (ErrUnavailable), rather than pile up another goroutine
// or wait as long as the client library does.
func TestBoundedFailsFastPastMaxBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, err := guard.New(memory.New())
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(g)
		if err != nil {
			t.Fatal(err)
		}
		hung := make(chan struct{})
		var calls atomic.Int32
		hang := func(context.Context) error {
			calls.Add(1)
			<-hung // a client that ignores its context
			return nil
		}
		for i := range maxBehind {
			if err := s.bounded(context.Background(), time.Second, hang, nil); !errors.Is(err, errLeftBehind) {
				t.Fatalf("call %d: %v, want it left behind at its bound", i+1, err)
			}
		}
		start := time.Now()
		err = s.bounded(context.Background(), time.Second, hang, nil)
		if !errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, errLeftBehind) || time.Since(start) != 0 {
			t.Fatalf("call %d: %v after %v, want ErrUnavailable at once, the call not made", maxBehind+1, err, time.Since(start))
		}
		synctest.Wait()
		if n := calls.Load(); n != maxBehind {
			t.Fatalf("%d calls made, want %d", n, maxBehind)
		}
		close(hung)
		synctest.Wait()
		// The calls left behind have ended: there is room again.
		if err := s.bounded(context.Background(), time.Second, func(context.Context) error { return nil }, nil); err != nil {
			t.Fatalf("a call once the others ended: %v", err)
		}
		s.Stop(context.Background())
	})
}

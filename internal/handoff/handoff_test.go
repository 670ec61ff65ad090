package handoff_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/internal/handoff"
)

var errNoAnswer = errors.New("no answer")

func double(_ context.Context, n int) (int, error) { return 2 * n, nil }

// TestAnswer: a call answered within its bound returns its answer, on a
// goroutine kept for the next call: one goroutine serves calls made one
// after the other, and ends once idle (the bubble, which fails its test
// while any is left, ends).
func TestAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cs handoff.Callers
		cs.Init(4, errNoAnswer)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for i := range 3 {
			v, err := handoff.Wait(&cs, &handoff.Call[int, int]{Ctx: ctx, F: double, Arg: i})
			if err != nil || v != 2*i {
				t.Fatalf("call %d: %d, %v; want %d, nil", i, v, err, 2*i)
			}
		}
		time.Sleep(time.Second)
	})
}

// TestNoAnswer: a call that ignores its context is answered for once its
// context is done and Grace has passed, not before; its own answer, come
// later, goes to Late, and its goroutine serves the next call.
func TestNoAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cs handoff.Callers
		cs.Init(1, errNoAnswer)
		const bound, late = 100 * time.Millisecond, time.Second
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		type answer struct{ arg, v int }
		lateAnswers := make(chan answer, 1)
		start := time.Now()
		_, err := handoff.Wait(&cs, &handoff.Call[int, int]{
			Ctx: ctx,
			F: func(_ context.Context, n int) (int, error) {
				time.Sleep(late)
				return n + 1, nil
			},
			Arg:  7,
			Late: func(arg, v int, err error) { lateAnswers <- answer{arg, v} },
		})
		if !errors.Is(err, errNoAnswer) {
			t.Fatalf("got %v, want the error given to Init", err)
		}
		if took := time.Since(start); took != bound+handoff.Grace {
			t.Errorf("answered for after %v, want the bound and Grace, %v", took, bound+handoff.Grace)
		}
		select {
		case a := <-lateAnswers:
			t.Fatalf("Late called with %v before the call answered", a)
		default:
		}
		if a := <-lateAnswers; a != (answer{7, 8}) || time.Since(start) != late {
			t.Errorf("Late got %v after %v, want {7 8} after %v", a, time.Since(start), late)
		}
		v, err := handoff.Wait(&cs, &handoff.Call[int, int]{Ctx: context.Background(), F: double, Arg: 5})
		if err != nil || v != 10 {
			t.Errorf("next call: %d, %v; want 10, nil", v, err)
		}
		time.Sleep(time.Second)
	})
}

// TestMaxLeft: against a backend that answers nothing and ignores its
// context, MaxLeft calls are left running; the next is not made and is
// answered at once; once the left calls return, calls are made again.
func TestMaxLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cs handoff.Callers
		cs.Init(0, errNoAnswer)
		hung := make(chan struct{})
		var made atomic.Int32
		hang := func(context.Context, int) (int, error) {
			made.Add(1)
			<-hung
			return 0, nil
		}
		for i := range handoff.MaxLeft {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			_, err := handoff.Wait(&cs, &handoff.Call[int, int]{Ctx: ctx, F: hang})
			cancel()
			if !errors.Is(err, errNoAnswer) {
				t.Fatalf("call %d: %v, want no answer", i+1, err)
			}
		}
		start := time.Now()
		_, err := handoff.Wait(&cs, &handoff.Call[int, int]{Ctx: context.Background(), F: hang})
		if !errors.Is(err, errNoAnswer) || time.Since(start) != 0 {
			t.Fatalf("call past MaxLeft: %v after %v, want no answer at once", err, time.Since(start))
		}
		synctest.Wait()
		if n := made.Load(); n != handoff.MaxLeft {
			t.Fatalf("%d calls made, want %d", n, handoff.MaxLeft)
		}
		close(hung)
		synctest.Wait()
		v, err := handoff.Wait(&cs, &handoff.Call[int, int]{Ctx: context.Background(), F: double, Arg: 4})
		if err != nil || v != 8 {
			t.Fatalf("a call once the left ones returned: %d, %v", v, err)
		}
	})
}

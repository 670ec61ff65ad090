package redislock

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestWatchdog: an attempt without an answer is cut short within a tick
// after attemptBound, and not before; one that ended is left alone; the
// watchdog's goroutine ends once nothing is in flight (synctest.Test fails
// on a goroutine left blocked in the bubble).
func TestWatchdog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w watchdog
		slowFlight := new(flight)
		slow := w.begin(context.Background(), slowFlight)
		defer w.end(slowFlight)
		quickFlight := new(flight)
		quick := w.begin(context.Background(), quickFlight)
		w.end(quickFlight)
		time.Sleep(attemptBound - time.Millisecond)
		synctest.Wait()
		if err := slow.Err(); err != nil {
			t.Fatalf("the attempt was cut short before its bound: %v", err)
		}
		time.Sleep(boundTick + time.Millisecond)
		synctest.Wait()
		if cause := context.Cause(slow); !errors.Is(cause, errNoAnswer) {
			t.Fatalf("the attempt's cause %v a tick after its bound, want errNoAnswer", cause)
		}
		if cause := context.Cause(quick); errors.Is(cause, errNoAnswer) {
			t.Fatal("an attempt that had ended was cut short")
		}
		// A later attempt starts the watchdog again.
		laterFlight := new(flight)
		later := w.begin(context.Background(), laterFlight)
		defer w.end(laterFlight)
		time.Sleep(attemptBound + boundTick)
		synctest.Wait()
		if cause := context.Cause(later); !errors.Is(cause, errNoAnswer) {
			t.Fatalf("a later attempt's cause %v past its bound, want errNoAnswer", cause)
		}
	})
}

// TestWatchdogEndsAnyOfThree: an attempt that ends between two others in
// flight leaves both to be cut at their bound (the list is relinked around
// it), and is not cut itself.
func TestWatchdogEndsAnyOfThree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w watchdog
		fs := []*flight{new(flight), new(flight), new(flight)}
		ctxs := make([]context.Context, len(fs))
		for i, f := range fs {
			ctxs[i] = w.begin(context.Background(), f)
			time.Sleep(time.Millisecond)
		}
		w.end(fs[1])
		time.Sleep(attemptBound + boundTick)
		synctest.Wait()
		for _, i := range []int{0, 2} {
			if cause := context.Cause(ctxs[i]); !errors.Is(cause, errNoAnswer) {
				t.Errorf("attempt %d's cause %v past its bound, want errNoAnswer", i, cause)
			}
			w.end(fs[i])
		}
		if cause := context.Cause(ctxs[1]); errors.Is(cause, errNoAnswer) {
			t.Error("the attempt that had ended was cut short")
		}
		if w.head != nil || w.tail != nil {
			t.Error("the watchdog still lists attempts after all ended")
		}
	})
}

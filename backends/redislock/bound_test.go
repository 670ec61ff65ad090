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
		slow, slowFlight := w.begin(context.Background())
		defer w.end(slowFlight)
		quick, quickFlight := w.begin(context.Background())
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
		later, laterFlight := w.begin(context.Background())
		defer w.end(laterFlight)
		time.Sleep(attemptBound + boundTick)
		synctest.Wait()
		if cause := context.Cause(later); !errors.Is(cause, errNoAnswer) {
			t.Fatalf("a later attempt's cause %v past its bound, want errNoAnswer", cause)
		}
	})
}

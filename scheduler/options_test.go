package scheduler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/scheduler"
)

// TestNilOptionsRefused: a nil option, or an option given nil, is refused
// by New with an error naming it, where it used to be skipped in silence
// (or, for WithSlotStore(nil), to run without the store asked for).
func TestNilOptionsRefused(t *testing.T) {
	g, err := guard.New(memory.New(), guard.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opt  scheduler.Option
		want string
	}{
		{nil, "nil Option"},
		{scheduler.WithSlotStore(nil), "WithSlotStore"},
		{scheduler.WithClock(nil), "WithClock"},
		{scheduler.WithLocation(nil), "WithLocation"},
		{scheduler.WithLogger(nil), "WithLogger"},
		{scheduler.WithTracerProvider(nil), "WithTracerProvider"},
		{scheduler.WithMeterProvider(nil), "WithMeterProvider"},
		{scheduler.WithRunObserver(nil), "WithRunObserver"},
		{scheduler.WithJobDefaults(nil), "WithJobDefaults"},
	} {
		if _, err := scheduler.New(g, tc.opt); !errors.Is(err, guard.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %s: %v, want ErrInvalidOption naming it", tc.want, err)
		}
	}
}

// TestJobBoundsBelowAMillisecondRefused: a bound of nanoseconds is a unit
// slip, refused when the job is added; so is a nil JobOption.
func TestJobBoundsBelowAMillisecondRefused(t *testing.T) {
	s, _ := newMemoryScheduler(t)
	noop := func(context.Context) error { return nil }
	for _, tc := range []struct {
		opt  scheduler.JobOption
		want string
	}{
		{nil, "nil JobOption"},
		{scheduler.LockAtMostFor(5), "LockAtMostFor"},
		{scheduler.LockAtLeastFor(5), "LockAtLeastFor"},
		{scheduler.WaitForLock(time.Microsecond), "WaitForLock"},
		{scheduler.MisfireAfter(time.Microsecond), "MisfireAfter"},
		{scheduler.SlotRetention(time.Microsecond), "SlotRetention"},
	} {
		if err := s.Add("@every 1s", "job-"+tc.want, noop, tc.opt); !errors.Is(err, scheduler.ErrInvalidJob) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Add with %s: %v, want ErrInvalidJob naming it", tc.want, err)
		}
	}
	if err := s.Add("@every 1s", "ok", noop, scheduler.WaitForLock(time.Millisecond), scheduler.LockAtLeastFor(0)); err != nil {
		t.Errorf("bounds at their minimum: %v", err)
	}
}

package driver_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// However long a wait lasts, every pause stays within (0, Max]: the bound
// neither overflows nor runs off the end of a table.
func TestBackoffStaysBoundedForever(t *testing.T) {
	b := driver.Backoff{Min: time.Millisecond, Max: 200 * time.Millisecond}
	sawMax := false
	for i := range 100_000 {
		d := b.Next()
		if d <= 0 || d > 200*time.Millisecond+1 {
			t.Fatalf("attempt %d: pause %v outside (0, 200ms]", i, d)
		}
		if d > 100*time.Millisecond {
			sawMax = true
		}
	}
	if !sawMax {
		t.Error("the bound never reached Max")
	}
	b.Reset()
	if d := b.Next(); d > time.Millisecond+1 {
		t.Errorf("after Reset: pause %v, want at most Min", d)
	}
	var zero driver.Backoff
	for range 1000 {
		if d := zero.Next(); d <= 0 || d > time.Second+1 {
			t.Fatalf("zero Backoff: pause %v outside (0, 1s]", d)
		}
	}
}

func TestSleep(t *testing.T) {
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	if err := driver.Sleep(context.Background(), time.Hour, wake); err != nil {
		t.Errorf("woken: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := driver.Sleep(ctx, time.Hour, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if err := driver.Sleep(context.Background(), time.Millisecond, nil); err != nil {
		t.Errorf("timed out: %v", err)
	}
}

func TestLimitsCheckTTL(t *testing.T) {
	l := driver.Limits{MinTTL: 2 * time.Second, MaxTTL: time.Hour, TTLStep: time.Second}
	for ttl, want := range map[time.Duration]string{
		0:                       "not positive",
		-time.Second:            "not positive",
		time.Second:             "below the backend's minimum",
		2 * time.Hour:           "above the backend's maximum",
		2500 * time.Millisecond: "whole multiple",
	} {
		err := l.CheckTTL(ttl)
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckTTL(%v): %v, want ErrInvalidOption naming %q", ttl, err, want)
		}
	}
	if err := l.CheckTTL(3 * time.Second); err != nil {
		t.Errorf("CheckTTL(3s): %v", err)
	}
	if err := (driver.Limits{}).CheckTTL(time.Nanosecond); err != nil {
		t.Errorf("no limits: %v", err)
	}
}

func TestUnavailable(t *testing.T) {
	ctx := context.Background()
	if driver.Unavailable(ctx, nil) != nil {
		t.Error("a nil error became one")
	}
	err := driver.Unavailable(ctx, io.ErrUnexpectedEOF)
	if !errors.Is(err, driver.ErrUnavailable) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("%v does not wrap both ErrUnavailable and the cause", err)
	}
	if again := driver.Unavailable(ctx, err); again != err {
		t.Errorf("wrapped twice: %v", again)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := driver.Unavailable(cancelled, io.ErrUnexpectedEOF); err != context.Canceled {
		t.Errorf("a call cut short by its ctx: %v, want ctx's own error", err)
	}
}

// TestNotSent: the mark matches ErrNotSent and keeps the error's text and
// chain, under Unavailable too; nil stays nil.
func TestNotSent(t *testing.T) {
	if driver.NotSent(nil) != nil {
		t.Error("a nil error became one")
	}
	err := driver.Unavailable(context.Background(), driver.NotSent(io.ErrUnexpectedEOF))
	if !errors.Is(err, driver.ErrNotSent) || !errors.Is(err, driver.ErrUnavailable) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("%v does not match ErrNotSent, ErrUnavailable and the cause", err)
	}
	if want := driver.Unavailable(context.Background(), io.ErrUnexpectedEOF).Error(); err.Error() != want {
		t.Errorf("marked: %q, want the text unchanged, %q", err, want)
	}
	if errors.Is(driver.Unavailable(context.Background(), io.ErrUnexpectedEOF), driver.ErrNotSent) {
		t.Error("an unmarked error matches ErrNotSent")
	}
}

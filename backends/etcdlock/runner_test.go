package etcdlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestUnboundRunners: a write whose caller waits returns its answer and
// leaves its runner idle for the next one, which reuses it; a caller whose
// ctx ends returns at once, and the write, finished without it, hands its
// answer to left; a closed pool keeps no runner.
func TestUnboundRunners(t *testing.T) {
	var p runners
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v, err := unbound(ctx, &p, func() (int, error) { return 7, nil }, func(int) { t.Error("left called for an answered write") })
	if v != 7 || err != nil {
		t.Fatalf("answered write: %d, %v; want 7, nil", v, err)
	}
	if n := p.Idle(); n != 1 {
		t.Fatalf("%d idle runners after one write, want 1", n)
	}
	if _, err := unbound(ctx, &p, func() (int, error) { return 0, nil }, nil); err != nil || p.Idle() != 1 {
		t.Fatalf("second write: %v, %d idle runners; want nil, 1", err, p.Idle())
	}

	release := make(chan struct{})
	left := make(chan int, 1)
	cctx, ccancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(10 * time.Millisecond)
		ccancel()
	}()
	v, err = unbound(cctx, &p, func() (int, error) { <-release; return 9, nil }, func(v int) { left <- v })
	if !errors.Is(err, context.Canceled) || v != 0 {
		t.Fatalf("abandoned write: %d, %v; want 0, context.Canceled", v, err)
	}
	close(release)
	select {
	case got := <-left:
		if got != 9 {
			t.Errorf("left got %d, want 9", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("left not called for an abandoned write")
	}

	p.Close()
	if _, err := unbound(ctx, &p, func() (int, error) { return 0, nil }, nil); err != nil {
		t.Fatal(err)
	}
	if idle := p.Idle(); idle != 0 {
		t.Errorf("%d idle runners in a closed pool", idle)
	}
}

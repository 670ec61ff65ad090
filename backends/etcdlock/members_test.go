package etcdlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard/driver"
)

// hang is a request that no member answers.
func hang(ctx context.Context, _ *clientv3.Client) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestWatchdog: the one watchdog of the requests in flight cuts each short
// at its own bound, however they overlap, leaves alone the requests
// answered in time and the caller's own cancellation, and disarms once
// nothing is in flight.
func TestWatchdog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := &members{pinned: &member{}, changed: make(chan struct{})}
		cut, err := ms.send(context.Background(), time.Now().Add(time.Second), func(context.Context, *clientv3.Client) error { return nil })
		if cut != nil || err != nil {
			t.Fatalf("answered request: cut %v, err %v", cut, err)
		}
		var wg sync.WaitGroup
		for _, d := range []time.Duration{3 * time.Second, time.Second, 2 * time.Second, 100 * time.Millisecond} {
			wg.Go(func() {
				start := time.Now()
				cut, err := ms.send(context.Background(), start.Add(d), hang)
				if took := time.Since(start); cut != errNoAnswer || err == nil || took != d {
					t.Errorf("request bounded by %v: cut %v, err %v after %v", d, cut, err, took)
				}
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		wg.Go(func() {
			cut, err := ms.send(ctx, time.Now().Add(time.Hour), hang)
			if cut != nil || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("request of a caller whose deadline came first: cut %v, err %v", cut, err)
			}
		})
		wg.Wait()
		time.Sleep(time.Hour)
		synctest.Wait()
		ms.mu.Lock()
		defer ms.mu.Unlock()
		if ms.oldest != nil || ms.newest != nil || !ms.armedAt.IsZero() {
			t.Errorf("nothing in flight, yet the list is %p..%p and the watchdog armed for %v", ms.oldest, ms.newest, ms.armedAt)
		}
	})
}

// TestRepeatKeepsItsBound: attempts that get no answer are sent again, each
// cut short after attemptTimeout, and all of them together no later than
// the request timeout, which the error then names.
func TestRepeatKeepsItsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := &members{pinned: &member{}, changed: make(chan struct{})}
		const b = bound(2500 * time.Millisecond)
		attempts := 0
		start := time.Now()
		err := ms.repeat(context.Background(), b, false, func(ctx context.Context, c *clientv3.Client) error {
			attempts++
			return hang(ctx, c)
		})
		if took := time.Since(start); took != time.Duration(b) || attempts != 3 {
			t.Errorf("%d attempts in %v, want 3 in %v", attempts, took, time.Duration(b))
		}
		if !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err %v, want ErrUnavailable, not the caller's deadline", err)
		}
	})
}

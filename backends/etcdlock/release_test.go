package etcdlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/warden-go/warden/guard/driver"
)

// lostDeleteAnswer applies the first Delete and loses its answer, after
// running during: an election during a release, whose first attempt
// landed on a leader that went away before it answered.
type lostDeleteAnswer struct {
	clientv3.KV
	during func()
	once   sync.Once
}

func (k *lostDeleteAnswer) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	resp, err := k.KV.Delete(ctx, key, opts...)
	lost := false
	k.once.Do(func() {
		lost = true
		k.during()
	})
	if lost {
		return nil, status.Error(codes.Unavailable, "the answer was lost with the leader")
	}
	return resp, err
}

// TestReleaseUnansweredAsSessionEnds: a release whose first delete landed
// without an answer, while the session ended, finds the key gone at its
// next attempt. The section ended while the session lived, so nobody else
// can have held the key then: that is no loss (ErrNotHeld would have
// guard report the section lost, and a job run again), but a release whose
// outcome went unconfirmed.
func TestReleaseUnansweredAsSessionEnds(t *testing.T) {
	eps := endpoints(t)
	c := newClient(t, eps)
	kv := &lostDeleteAnswer{KV: c.KV}
	c.KV = kv
	l := lockerOn(t, c)
	ctx := context.Background()
	key := name("release-unanswered")
	got, err := l.Acquire(ctx, key, opts(10*time.Second, false))
	if err != nil {
		t.Fatal(err)
	}
	le := got.(*lease)
	other := newClient(t, eps)
	kv.during = func() {
		if _, err := other.Revoke(ctx, le.s.id); err != nil {
			t.Errorf("revoking the session: %v", err)
		}
		for deadline := time.Now().Add(10 * time.Second); !le.s.lost(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the session was not found lost within 10s of its revocation")
			}
		}
	}
	err = got.Release(ctx)
	if err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release: %v, want an error that is not ErrNotHeld", err)
	}
	if keys := keysUnder(t, other, key); len(keys) != 0 {
		t.Errorf("keys left after the release: %v", keys)
	}
}

// TestReleaseTwice: a lease released a second time, after its session put
// its key again for a semaphore holder (the same name, the same key), is
// refused with ErrNotHeld and deletes nothing: the semaphore's holder keeps
// its permit, and its key.
func TestReleaseTwice(t *testing.T) {
	l, c := newLocker(t, endpoints(t))
	ctx := context.Background()
	key := name("release-twice")
	first, err := l.AcquireSemaphore(ctx, key, 2, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := l.AcquireSemaphore(ctx, key, 2, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.(*lease).key() != first.(*lease).key() {
		t.Fatalf("the session put %q, not the released key %q again", next.(*lease).key(), first.(*lease).key())
	}
	if err := first.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("second release: %v, want ErrNotHeld", err)
	}
	if keys := keysUnder(t, c, key); len(keys) != 1 {
		t.Errorf("keys after the second release: %v, want the holder's", keys)
	}
	if err := next.(*lease).Refresh(ctx, MinTTL); err != nil {
		t.Errorf("the holder after another lease's second release: %v", err)
	}
}

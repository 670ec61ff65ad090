package etcdlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/warden-go/warden/guard/driver"
)

// TestKeyPutAgain: a session takes a lock again with the key of its last
// release, each time with a new create revision (the token), and gives a
// concurrent contender of its own a key of its own; a key that a forced
// release took is not put again.
func TestKeyPutAgain(t *testing.T) {
	eps := endpoints(t)
	l, c := newLocker(t, eps)
	ctx := context.Background()
	k := name("put-again")
	first, err := l.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	own := first.(*lease).key()
	token := first.Token()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var held driver.Lease
	for i := range 3 {
		le, err := l.Acquire(ctx, k, opts(MinTTL, false))
		if err != nil {
			t.Fatal(err)
		}
		if got := le.(*lease).key(); got != own {
			t.Errorf("acquisition %d put %q, want the released %q again", i+2, got, own)
		}
		if le.Token() <= token {
			t.Errorf("acquisition %d: token %d after %d", i+2, le.Token(), token)
		}
		token = le.Token()
		if i == 2 {
			held = le
			break
		}
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Another contender of the same session, while the key is in use,
	// queues with a key of its own (were it the same, its put would
	// overwrite the holder's, and one key would be listed).
	granted := make(chan driver.Lease, 1)
	go func() {
		le, err := l.Acquire(ctx, k, opts(MinTTL, true))
		if err != nil {
			t.Error(err)
		}
		granted <- le
	}()
	waitFor(t, "the second contender is queued", func() bool { return len(keysUnder(t, c, k)) == 2 })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-granted
	if second == nil {
		t.FailNow()
	}
	if second.(*lease).key() == own || second.Token() <= token {
		t.Errorf("second contender: key %q token %d, after %q with token %d", second.(*lease).key(), second.Token(), own, token)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}

	held, err = l.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	if got := held.(*lease).key(); got != own {
		t.Errorf("after the second contender: put %q, want %q again", got, own)
	}
	if _, err := l.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true}); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release after a forced release: got %v, want ErrNotHeld", err)
	}
	next, err := l.Acquire(ctx, k, opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	if next.(*lease).key() == own {
		t.Errorf("the key %q a forced release took was put again", own)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// unanswered fails the first DeleteRange after it is armed as a request
// without an answer, either sent (its answer lost with the connection) or
// not (held on its way, as during a leader election, to land later).
type unanswered struct {
	armed atomic.Bool
	send  bool
}

func (u *unanswered) dialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method != "/etcdserverpb.KV/DeleteRange" || !u.armed.CompareAndSwap(true, false) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if u.send {
			invoker(ctx, method, req, reply, cc, opts...)
		}
		return status.Error(codes.Unavailable, "no answer")
	})
}

// TestKeyRetiredAfterUnknownRelease: a release whose first delete got no
// answer succeeds on a later attempt, and the key is not put again, since
// the first delete, if it was not applied, could still be on its way.
func TestKeyRetiredAfterUnknownRelease(t *testing.T) {
	eps := endpoints(t)
	for _, send := range []bool{false, true} {
		u := &unanswered{send: send}
		l := lockerOn(t, newClient(t, eps, u.dialOption()))
		ctx := context.Background()
		k := name("retired")
		held, err := l.Acquire(ctx, k, opts(MinTTL, false))
		if err != nil {
			t.Fatal(err)
		}
		own := held.(*lease).key()
		u.armed.Store(true)
		if err := held.Release(ctx); err != nil {
			t.Fatalf("sent %v: release whose first delete got no answer: %v", send, err)
		}
		if u.armed.Load() {
			t.Fatal("no delete was sent")
		}
		next, err := l.Acquire(ctx, k, opts(MinTTL, false))
		if err != nil {
			t.Fatal(err)
		}
		if next.(*lease).key() == own {
			t.Errorf("sent %v: the key %q of a release whose first delete got no answer was put again", send, own)
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPredecessorPutAgain: a waiter's predecessor key that was deleted and
// put again (its session taking the lock again) before the waiter's watch
// started is gone as far as the waiter is concerned: the new key stands
// after the waiter's, and waiting for its deletion would wait for the
// waiter itself.
func TestPredecessorPutAgain(t *testing.T) {
	eps := endpoints(t)
	l, c := newLocker(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := KeyDir(name("put-again-pred")) + "pred"
	put, err := c.Put(ctx, key, "")
	if err != nil {
		t.Fatal(err)
	}
	created := put.Header.Revision
	if _, err := c.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, key, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Delete(context.Background(), key) })
	s, err := l.session(ctx, MinTTL)
	if err != nil {
		t.Fatal(err)
	}
	a := &attempt{l: l, s: s}
	start := time.Now()
	if err := a.waitDeleted(ctx, key, created, created); err != nil {
		t.Fatalf("waiting for a predecessor put again since: %v after %v", err, time.Since(start))
	}
}

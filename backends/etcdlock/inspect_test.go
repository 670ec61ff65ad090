package etcdlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// TestInspectReaders: readers sharing the lock are all its holders, a writer
// queued behind them is a waiter, and ForceRelease of any holder takes every reader, after
// which the writer holds with a greater token.
func TestInspectReaders(t *testing.T) {
	eps := endpoints(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, _ := newLocker(t, eps)
	b, _ := newLocker(t, eps)
	admin, _ := newLocker(t, eps)
	k := name("inspect-readers")
	var readers []driver.Lease
	for _, l := range []*Locker{a, b} {
		r, err := l.AcquireRead(ctx, k, opts(MinTTL, false))
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	inspect := func() driver.Inspection {
		t.Helper()
		in, err := admin.Inspect(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	tokens := func(hs []driver.Holding) []uint64 {
		var out []uint64
		for _, h := range hs {
			out = append(out, h.Token)
		}
		return out
	}
	want := []uint64{readers[0].Token(), readers[1].Token()}
	if in := inspect(); !slices.Equal(tokens(in.Holders), want) || in.Waiters != 0 || !in.Holders[0].SessionBound {
		t.Fatalf("two readers: %+v, want session-bound holders with tokens %v and no waiter", in, want)
	}
	writer := make(chan driver.Lease, 1)
	go func() {
		w, err := a.AcquireWrite(ctx, k, opts(MinTTL, true))
		if err != nil {
			t.Error(err)
		}
		writer <- w
	}()
	waitFor(t, "the writer queues", func() bool { return inspect().Waiters == 1 })
	got, err := admin.ForceRelease(ctx, k, driver.ReleaseTarget{AnyHolder: true})
	if err != nil || !slices.Equal(tokens(got), want) {
		t.Fatalf("ForceRelease: %+v, %v; want the readers with tokens %v", got, err, want)
	}
	w := <-writer
	if w == nil {
		t.FailNow()
	}
	if in := inspect(); !slices.Equal(tokens(in.Holders), []uint64{w.Token()}) || w.Token() <= want[1] {
		t.Fatalf("after the forced release: %+v, writer's token %d; want the writer alone, after %d", in, w.Token(), want[1])
	}
	for _, r := range readers {
		if err := r.Release(ctx); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("a forcibly released reader's Release: %v, want ErrNotHeld", err)
		}
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestListOrder: List pages in the keys' own order, which the escaped
// directory names etcd sorts by do not keep.
func TestListOrder(t *testing.T) {
	l, _ := newLocker(t, endpoints(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := name("list-order") + "/"
	keys := []string{"a.b", "a", "a-", "a$", "a ", "B", "a/b", "é", "%"}
	for _, k := range keys {
		lease, err := l.Acquire(ctx, prefix+k, opts(MinTTL, false))
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
	}
	var got []string
	for after := ""; ; {
		page, err := l.List(ctx, prefix, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			got = append(got, p.Key[len(prefix):])
		}
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Key
	}
	if want := slices.Sorted(slices.Values(keys)); !slices.Equal(got, want) {
		t.Fatalf("listed %q, want %q", got, want)
	}
}

// TestForceReleaseTellsHolder: a lock forcibly released through guard ends
// its holder's section with guard.ErrLockLost while the holder's session
// lives on, the marker that told it is deleted, and List never reports it;
// a lease released before the revocation arrives is never told.
func TestForceReleaseTellsHolder(t *testing.T) {
	eps := endpoints(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, c := newLocker(t, eps)
	admin, _ := newLocker(t, eps)
	prefix := name("force-tells") + "/"
	g, err := guard.New(holder, guard.WithTTL(MinTTL), guard.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ga, err := guard.New(admin, guard.WithTTL(MinTTL), guard.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := g.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(context.Background())
	other, err := g.TryLock(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Unlock(context.Background())
	if _, err := ga.ForceRelease(ctx, "job", guard.ReleaseTarget{Token: lk.Token()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Context().Done():
	case <-ctx.Done():
		t.Fatal("the holder's lock was not lost after a forced release")
	}
	if err := context.Cause(lk.Context()); !errors.Is(err, guard.ErrLockLost) {
		t.Errorf("cause %v, want guard.ErrLockLost", err)
	}
	if err := other.Err(); err != nil {
		t.Errorf("the session's other lock: %v", err)
	}
	holder.mu.Lock()
	id := holder.sessions[MinTTL].id
	holder.mu.Unlock()
	waitFor(t, "the marker is deleted", func() bool {
		resp, err := c.Get(ctx, revokedDir(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})

	// Released, then asked to report a revocation: it never will.
	le, err := holder.Acquire(ctx, prefix+"released", opts(MinTTL, false))
	if err != nil {
		t.Fatal(err)
	}
	called := make(chan struct{}, 1)
	le.(driver.RevocableLease).OnRevoke(func() { called <- struct{}{} })
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	le.(driver.RevocableLease).OnRevoke(func() { called <- struct{}{} })
	select {
	case <-called:
		t.Error("OnRevoke's function was called for a released lease")
	default:
	}

	// A marker left by a holder that never saw it: List, whose prefix
	// "warden" reads it, skips it.
	marker := RevokedPrefix + "0/" + KeyDir(prefix+"ghost") + "1-1"
	if _, err := c.Put(ctx, marker, ""); err != nil {
		t.Fatal(err)
	}
	defer c.Delete(context.Background(), marker)
	listed, err := admin.List(ctx, "warden", "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range listed {
		if strings.HasPrefix(l.Key, "warden/") {
			t.Errorf("List reports a revocation marker as lock %q", l.Key)
		}
	}
}

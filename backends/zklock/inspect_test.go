package zklock

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestInspectReaders: readers sharing the lock are all its holders, a writer
// queued behind them is a waiter, and ForceRelease takes every reader, after
// which the writer holds with a greater token.
func TestInspectReaders(t *testing.T) {
	srv := servers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b, admin := dial(t, srv), dial(t, srv), dial(t, srv)
	k := testKey(t)
	var readers []driver.Lease
	for _, l := range []*Locker{a, b} {
		r, err := l.AcquireRead(ctx, k, driver.AcquireOptions{TTL: testSession})
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
		w, err := a.AcquireWrite(ctx, k, driver.AcquireOptions{TTL: testSession, Wait: true})
		if err != nil {
			t.Error(err)
		}
		writer <- w
	}()
	eventually(t, "the writer queues", func() bool { return inspect().Waiters == 1 })
	got, err := admin.ForceRelease(ctx, k)
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

// TestListOrder: List pages in the keys' own order, whatever their escaped
// node names, and leaves semaphores out.
func TestListOrder(t *testing.T) {
	l := dial(t, servers(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := testKey(t) + "/"
	sem, err := l.AcquireSemaphore(ctx, prefix+"sem", 2, driver.AcquireOptions{TTL: testSession})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Release(ctx)
	keys := []string{"a.b", "a", "a-", "a$", "a ", "B", "a/b", "é", "%"}
	for _, k := range keys {
		lease, err := l.Acquire(ctx, prefix+k, driver.AcquireOptions{TTL: testSession})
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

package guard_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// onRelease is the memory backend, declared bounded by its context, whose
// leases call release with their release context before they release: a
// test's view of what a backend does with that context.
type onRelease struct {
	mem     *memory.Locker
	release func(ctx context.Context)
}

func (o *onRelease) Acquire(ctx context.Context, key string, opts driver.AcquireOptions) (driver.Lease, error) {
	l, err := o.mem.Acquire(ctx, key, opts)
	if err != nil {
		return nil, err
	}
	return &onReleaseLease{Lease: l, o: o}, nil
}

func (o *onRelease) BoundedByContext() bool { return true }

type onReleaseLease struct {
	driver.Lease
	o *onRelease
}

func (l *onReleaseLease) Release(ctx context.Context) error {
	l.o.release(ctx)
	return l.Lease.Release(ctx)
}

// The release context a backend kept, or derived a context from, is done
// once the release is over: work a backend left running on it stops, at
// the latest, at its deadline. (Its timer used to be stopped with the
// release, and its Done then never closed.)
func TestReleaseContextEndsWithTheRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var kept, child context.Context
		var stopChild context.CancelFunc
		var deadline time.Time
		b := &onRelease{mem: memory.New(), release: func(ctx context.Context) {
			kept = ctx
			deadline, _ = ctx.Deadline()
			child, stopChild = context.WithCancel(ctx) // left running, as background work would be
		}}
		g := newBubbleGuard(t, b, guard.WithReleaseTimeout(time.Second))
		l, err := g.TryLock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		if want := start.Add(time.Second); !deadline.Equal(want) {
			t.Errorf("release context's deadline %v, want the release timeout from the release, %v", deadline, want)
		}
		time.Sleep(2 * time.Second)
		for name, ctx := range map[string]context.Context{"release context": kept, "its child": child} {
			select {
			case <-ctx.Done():
				if ctx.Err() == nil {
					t.Errorf("%s is done with no error", name)
				}
			default:
				t.Errorf("%s not done past the release and its deadline (err %v)", name, ctx.Err())
			}
		}
		stopChild()
	})
}

// The release context carries the caller's values but neither its
// cancellation nor its cause: a release made with a cancelled context (a
// request that ended) runs, and when it runs out of time, context.Cause
// says its own deadline passed, not why the caller's context ended.
func TestReleaseContextHidesTheCallersCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		var errAtStart, errAtEnd, cause error
		var value any
		b := &onRelease{mem: memory.New(), release: func(ctx context.Context) {
			errAtStart, value = ctx.Err(), ctx.Value(key{})
			<-ctx.Done()
			errAtEnd, cause = ctx.Err(), context.Cause(ctx)
		}}
		g := newBubbleGuard(t, b, guard.WithReleaseTimeout(time.Second))
		l, err := g.TryLock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
		cancel(errors.New("the request ended"))
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if errAtStart != nil {
			t.Errorf("release context of a cancelled caller's: Err %v at the start, want nil", errAtStart)
		}
		if value != "v" {
			t.Errorf("release context's value %v, want the caller's %q", value, "v")
		}
		if !errors.Is(errAtEnd, context.DeadlineExceeded) || !errors.Is(cause, context.DeadlineExceeded) {
			t.Errorf("release context past its deadline: Err %v, Cause %v; want both DeadlineExceeded", errAtEnd, cause)
		}
	})
}

// A backend's context.WithTimeout or AfterFunc of the release context
// hooks into it: no goroutine is started to watch it per release.
func TestReleaseContextNeedsNoWatcher(t *testing.T) {
	const releases = 100
	var started uint64
	b := &onRelease{mem: memory.New(), release: func(ctx context.Context) {
		before := goroutinesStarted()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		stop := context.AfterFunc(ctx, func() {})
		started += goroutinesStarted() - before
		if cctx.Err() != nil {
			t.Errorf("a release's derived context is done during the release: %v", cctx.Err())
		}
		stop()
		cancel()
	}}
	g := newGuard(t, b)
	for range releases {
		l, err := g.TryLock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Other tests' goroutines may start meanwhile, but not one per release.
	if started >= releases/2 {
		t.Errorf("%d goroutines started by %d releases' derived contexts", started, releases)
	}
}

// Each release context is done at its own deadline, the release timeout
// from its start, or with its release if that comes first, however the
// releases of one Guard interleave: the first and last here wait for their
// context, and the one between them, which returns at once, leaves the
// others' deadlines as they were.
func TestReleaseContextsEndAtTheirDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type ended struct {
			at     time.Time
			err    error
			cause  error
			direct bool // the release returned before its context was done
		}
		var mu sync.Mutex
		got := map[string]ended{}
		b := &onRelease{mem: memory.New(), release: func(ctx context.Context) {
			key, _ := ctx.Value(keyName{}).(string)
			e := ended{direct: key == "b"}
			if !e.direct {
				<-ctx.Done()
			}
			e.at, e.err, e.cause = time.Now(), ctx.Err(), context.Cause(ctx)
			mu.Lock()
			got[key] = e
			mu.Unlock()
		}}
		g := newBubbleGuard(t, b, guard.WithReleaseTimeout(time.Second))
		start := time.Now()
		var wg sync.WaitGroup
		for i, key := range []string{"a", "b", "c"} {
			l, err := g.TryLock(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 100 * time.Millisecond)
				if err := l.Unlock(context.WithValue(context.Background(), keyName{}, key)); err != nil {
					t.Errorf("Unlock %s: %v", key, err)
				}
			})
		}
		wg.Wait()
		for i, key := range []string{"a", "b", "c"} {
			e, ok := got[key]
			if !ok {
				t.Errorf("%s: not released", key)
				continue
			}
			if e.direct {
				if e.err != nil {
					t.Errorf("%s: its release context was done (%v) before its release returned", key, e.err)
				}
				continue
			}
			want := start.Add(time.Duration(i)*100*time.Millisecond + time.Second)
			if !e.at.Equal(want) || !errors.Is(e.err, context.DeadlineExceeded) || !errors.Is(e.cause, context.DeadlineExceeded) {
				t.Errorf("%s: release context done at %v with Err %v, Cause %v; want at %v with DeadlineExceeded",
					key, e.at.Sub(start), e.err, e.cause, want.Sub(start))
			}
		}
	})
}

type keyName struct{}

// A function given to the release context's AfterFunc method, which the
// context package calls for a context derived from it, runs when the
// release ends, unless it was stopped first, and a stop reports whether it
// took the function back.
func TestReleaseContextAfterFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var stopped, kept atomic.Bool
		var stopKept func() bool
		b := &onRelease{mem: memory.New(), release: func(ctx context.Context) {
			a, ok := ctx.(interface{ AfterFunc(func()) func() bool })
			if !ok {
				t.Fatal("the release context has no AfterFunc method: a context derived from it needs a goroutine")
			}
			stop := a.AfterFunc(func() { stopped.Store(true) })
			stopKept = a.AfterFunc(func() { kept.Store(true) })
			if !stop() {
				t.Error("stop of a function registered during the release: false, want true")
			}
		}}
		g := newBubbleGuard(t, b)
		l, err := g.TryLock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if stopped.Load() {
			t.Error("a stopped function ran")
		}
		if !kept.Load() {
			t.Error("a function not stopped did not run when the release ended")
		}
		if stopKept() {
			t.Error("stop of a function that ran: true, want false")
		}
	})
}

// TestUnlockWithTheLocksOwnContext: Unlock given the lock's own context, or
// a context of values over it, releases, on a backend whose release guard
// bounds (no ContextBounded) and on one that reads its context: making the
// release's bound calls nothing of the caller's context, whose methods take
// the Lock's mutex. Real time, not synctest: a goroutine blocked on a
// mutex is not durably blocked, so a bubble would not report it.
func TestUnlockWithTheLocksOwnContext(t *testing.T) {
	type key struct{}
	for name, b := range map[string]driver.Locker{
		"bounded by guard": newFaulty(t),
		"reads its context": &onRelease{mem: memory.New(), release: func(ctx context.Context) {
			ctx.Done()
			ctx.Deadline()
		}},
	} {
		t.Run(name, func(t *testing.T) {
			g := newGuard(t, b)
			for _, over := range []func(context.Context) context.Context{
				func(ctx context.Context) context.Context { return ctx },
				func(ctx context.Context) context.Context { return context.WithValue(ctx, key{}, 1) },
			} {
				l, err := g.TryLock(context.Background(), "k")
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- l.Unlock(over(l.Context())) }()
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("Unlock: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("Unlock with the lock's own context did not return within 5s")
				}
			}
		})
	}
}

// detached is a hand-made detached context, as written before
// context.WithoutCancel: no Done, no deadline, and Value passed through.
type detached struct{ context.Context }

func (detached) Done() <-chan struct{}       { return nil }
func (detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detached) Err() error                  { return nil }

// TestReleaseContextHidesCauseThroughDetached: the caller's cause stays
// hidden from the release context when the caller's context only looks
// detached (its Value still reaches a cancelled parent): at its deadline,
// the release context's cause is its own.
func TestReleaseContextHidesCauseThroughDetached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cause error
		b := &onRelease{mem: memory.New(), release: func(ctx context.Context) {
			<-ctx.Done()
			cause = context.Cause(ctx)
		}}
		g := newBubbleGuard(t, b, guard.WithReleaseTimeout(time.Second))
		l, err := g.TryLock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errors.New("the request ended"))
		if err := l.Unlock(detached{ctx}); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(cause, context.DeadlineExceeded) {
			t.Errorf("release context's cause at its deadline %v, want DeadlineExceeded", cause)
		}
	})
}

// DoAll that gives up partway (a later key is held) releases every key it
// took, even when one of their Unlocks panics: the others are not left held
// and renewed.
func TestDoAllGivingUpReleasesWhatItTook(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	c, err := newGuard(t, mem).TryLock(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Unlock(ctx)
	var fired atomic.Bool
	g := newGuard(t, &onRelease{mem: mem, release: func(context.Context) {
		if fired.CompareAndSwap(false, true) {
			panic("release of b")
		}
	}})
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		err = g.DoAll(ctx, []string{"a", "b", "c"}, func(context.Context, []*guard.Lock) error { return nil }, guard.NoWait())
	}()
	if recovered != "release of b" {
		t.Errorf("DoAll: recovered %v, err %v; want the Unlock's panic", recovered, err)
	}
	if held := g.Held(); len(held) != 0 {
		t.Errorf("held after DoAll gave up: %+v", held)
	}
	if l, err := newGuard(t, mem).TryLock(ctx, "a"); err != nil {
		t.Errorf("a not released: %v", err)
	} else {
		l.Unlock(ctx)
	}
}

// An Unlock deferred before the error check meets the nil *Lock a failed
// TryLock returns: it releases nothing and returns nil, not a panic, and
// the holder's lock stays held; its Err says it holds nothing.
func TestUnlockOfAFailedLock(t *testing.T) {
	g, err := guard.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	held, err := g.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	l, err := g.TryLock(ctx, "k")
	if !errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("second TryLock: %v, want ErrNotAcquired", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Errorf("Unlock of the failed TryLock's %v: %v, want nil", l, err)
	}
	if err := l.Err(); !errors.Is(err, guard.ErrNotHeld) {
		t.Errorf("Err of the failed TryLock's %v: %v, want ErrNotHeld", l, err)
	}
	if err := held.Err(); err != nil {
		t.Errorf("the holder's lock after the failed one's Unlock: %v", err)
	}
	if k, tok, exp := l.Key(), l.Token(), l.Expiry(); k != "" || tok != 0 || !exp.IsZero() {
		t.Errorf("the failed TryLock's Key, Token, Expiry: %q, %d, %v; want \"\", 0, zero", k, tok, exp)
	}
	// Work started on its context despite the error must not run.
	lctx := l.Context()
	select {
	case <-lctx.Done():
	default:
		t.Fatal("the failed TryLock's context is not done")
	}
	if cause := context.Cause(lctx); !errors.Is(cause, guard.ErrNotHeld) {
		t.Errorf("the failed TryLock's context's cause: %v, want ErrNotHeld", cause)
	}
}

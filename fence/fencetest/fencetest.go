// Package fencetest is the conformance suite of fenced stores: every
// engine's fenced writes (and httpmw.Fence in front of one) pass Run on the
// engine's real server. Its concurrent case records every write attempt and
// read with its start and end and checks the history for linearizability
// against a fenced register with github.com/anishathalye/porcupine.
package fencetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
)

// Store is an engine's fenced writes as the suite drives them: one data item
// per resource, written whole (Set) or counted (Incr) under a claim through
// the engine's own fenced operations, and read without a fence (Get).
type Store interface {
	// Set writes value as the resource's data under c, fenced.
	Set(ctx context.Context, c fence.Claim, value string) error
	// Incr adds one to the resource's count under c, fenced: a write that
	// applied twice shows.
	Incr(ctx context.Context, c fence.Claim) error
	// Get reads the resource's data and its highest accepted token (0 when
	// none was).
	Get(ctx context.Context, resource string) (State, error)
}

// State is a resource as Get reads it.
type State struct {
	Value   string
	Count   int64
	Highest uint64
}

// Backend is the engine under test.
type Backend struct {
	// New returns a Store on the engine's server.
	New func(t testing.TB) Store
	// Through returns a Store that reaches the server at addr, a relay the
	// suite cuts while calls are in flight. Upstream is the address the
	// relay forwards to. Both are required: a fenced store must show that a
	// write whose outcome its client never learnt is not applied twice.
	Through  func(t testing.TB, addr string) Store
	Upstream string
	// NoCut, when not empty, says why no relay can stand between the
	// engine's client and its server: an engine in the test's process
	// (SQLite), a Redis Cluster client that follows the slot map to the
	// nodes themselves. Through and Upstream are then not used, and the
	// unknown-outcome case is skipped with that reason.
	NoCut string
	// Resource turns the suite's resource name into one the engine accepts
	// for both the fence and the data (a Redis Cluster hash tag). nil: as
	// is.
	Resource func(name string) string
}

// Run runs the suite.
func Run(t *testing.T, b Backend) {
	if b.New == nil || (b.NoCut == "" && (b.Through == nil || b.Upstream == "")) {
		t.Fatal("fencetest: Backend.New, Through and Upstream are required")
	}
	if b.Resource == nil {
		b.Resource = func(name string) string { return name }
	}
	t.Run("StaleRefused", func(t *testing.T) { testStaleRefused(t, &b) })
	t.Run("EqualAndGreaterAccepted", func(t *testing.T) { testEqualAndGreater(t, &b) })
	t.Run("HighestNeverMovesBack", func(t *testing.T) { testNeverBack(t, &b) })
	t.Run("ResourcesIndependent", func(t *testing.T) { testIndependent(t, &b) })
	t.Run("InvalidClaim", func(t *testing.T) { testInvalid(t, &b) })
	t.Run("ConcurrentLinearizable", func(t *testing.T) { testConcurrent(t, &b) })
	t.Run("UnknownOutcomeAppliedOnce", func(t *testing.T) {
		if b.NoCut != "" {
			t.Skip(b.NoCut)
		}
		testUnknownOutcome(t, &b)
	})
}

var seq atomic.Int64

// resource returns a name no other test, process or earlier run against
// the same server uses.
func (b *Backend) resource() string {
	return b.Resource(fmt.Sprintf("fencetest/%d.%d.%d", os.Getpid(), time.Now().UnixNano(), seq.Add(1)))
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func get(t testing.TB, ctx context.Context, s Store, r string) State {
	t.Helper()
	st, err := s.Get(ctx, r)
	if err != nil {
		t.Fatalf("Get(%q): %v", r, err)
	}
	return st
}

func wantStale(t testing.TB, what string, err error, highest uint64) {
	t.Helper()
	if !errors.Is(err, fence.ErrStaleToken) || !errors.Is(err, guard.ErrLockLost) {
		t.Fatalf("%s: got %v, want an error wrapping fence.ErrStaleToken and guard.ErrLockLost", what, err)
	}
	if h := fence.Highest(err); h != 0 && h != highest {
		t.Errorf("%s: refusal names highest %d, want %d", what, h, highest)
	}
}

func testStaleRefused(t *testing.T, b *Backend) {
	ctx, s, r := ctxFor(t), b.New(t), b.resource()
	if err := s.Set(ctx, fence.Claim{Resource: r, Token: 5}, "five"); err != nil {
		t.Fatalf("first write: %v", err)
	}
	wantStale(t, "Set with a lower token", s.Set(ctx, fence.Claim{Resource: r, Token: 4}, "four"), 5)
	wantStale(t, "Incr with a lower token", s.Incr(ctx, fence.Claim{Resource: r, Token: 1}), 5)
	if st := get(t, ctx, s, r); st != (State{Value: "five", Highest: 5}) {
		t.Errorf("after the stale writes: %+v, want value five, count 0, highest 5", st)
	}
}

func testEqualAndGreater(t *testing.T, b *Backend) {
	ctx, s, r := ctxFor(t), b.New(t), b.resource()
	for _, w := range []struct {
		token uint64
		value string
	}{{5, "a"}, {5, "b"}, {7, "c"}, {7, "d"}} {
		if err := s.Set(ctx, fence.Claim{Resource: r, Token: w.token}, w.value); err != nil {
			t.Fatalf("Set(%d, %q): %v", w.token, w.value, err)
		}
	}
	for range 2 {
		if err := s.Incr(ctx, fence.Claim{Resource: r, Token: 7}); err != nil {
			t.Fatalf("Incr at the highest token: %v", err)
		}
	}
	if err := s.Incr(ctx, fence.Claim{Resource: r, Token: 9}); err != nil {
		t.Fatalf("Incr above the highest token: %v", err)
	}
	if st := get(t, ctx, s, r); st != (State{Value: "d", Count: 3, Highest: 9}) {
		t.Errorf("got %+v, want value d, count 3, highest 9", st)
	}
}

func testNeverBack(t *testing.T, b *Backend) {
	ctx, s, r := ctxFor(t), b.New(t), b.resource()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 25))
	var highest uint64
	var count int64
	value := ""
	for i := range 40 {
		tok := 1 + rng.Uint64N(30)
		c := fence.Claim{Resource: r, Token: tok}
		var err error
		incr := i%3 == 0
		v := fmt.Sprint("v", i)
		if incr {
			err = s.Incr(ctx, c)
		} else {
			err = s.Set(ctx, c, v)
		}
		if tok < highest {
			wantStale(t, fmt.Sprintf("write %d at token %d below %d", i, tok, highest), err, highest)
		} else {
			if err != nil {
				t.Fatalf("write %d at token %d, highest %d: %v", i, tok, highest, err)
			}
			highest = tok
			if incr {
				count++
			} else {
				value = v
			}
		}
		if st := get(t, ctx, s, r); st != (State{Value: value, Count: count, Highest: highest}) {
			t.Fatalf("after write %d (token %d): %+v, want value %q, count %d, highest %d", i, tok, st, value, count, highest)
		}
	}
}

func testIndependent(t *testing.T, b *Backend) {
	ctx, s := ctxFor(t), b.New(t)
	r1, r2 := b.resource(), b.resource()
	if err := s.Set(ctx, fence.Claim{Resource: r1, Token: 100}, "x"); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, fence.Claim{Resource: r2, Token: 3}, "y"); err != nil {
		t.Fatalf("a low token on another resource: %v", err)
	}
	if st := get(t, ctx, s, r2); st.Highest != 3 || st.Value != "y" {
		t.Errorf("second resource: %+v, want value y, highest 3", st)
	}
}

func testInvalid(t *testing.T, b *Backend) {
	ctx, s, r := ctxFor(t), b.New(t), b.resource()
	for _, c := range []fence.Claim{{Resource: r, Token: 0}, {Resource: "", Token: 1}} {
		if err := s.Set(ctx, c, "z"); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("Set under %+v: got %v, want ErrInvalidOption", c, err)
		}
	}
	if st := get(t, ctx, s, r); st != (State{}) {
		t.Errorf("after refused claims: %+v, want nothing written", st)
	}
}

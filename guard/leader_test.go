package guard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
)

func TestCampaignElectsOneAtATimeWithGrowingTerms(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	a := newGuard(t, mem, guard.WithOwner("a"))
	b := newGuard(t, mem, guard.WithOwner("b"))

	la, err := a.Campaign(ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Campaign(ctx, "reports", guard.NoWait()); !errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("second candidate while a leads: %v, want ErrNotAcquired", err)
	}
	elected := make(chan *guard.Leadership, 1)
	go func() {
		lb, err := b.Campaign(ctx, "reports")
		if err != nil {
			t.Error(err)
		}
		elected <- lb
	}()
	waitFor(t, "b waits behind a", 5*time.Second, func() bool { return mem.Waiters("warden:election:reports") == 1 })
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if la.Context().Err() == nil || la.Err() == nil {
		t.Fatal("a's term still open after Resign")
	}
	lb := <-elected
	if lb == nil {
		t.FailNow()
	}
	if lb.Term() <= la.Term() {
		t.Fatalf("term %d after term %d: terms must grow", lb.Term(), la.Term())
	}
	if lb.Election() != "reports" {
		t.Fatalf("Election() = %q", lb.Election())
	}
	if err := lb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCampaignContextBoundsOnlyTheWait(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	g := newGuard(t, memory.New())
	ld, err := g.Campaign(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := ld.Context().Err(); err != nil {
		t.Fatalf("term ended with Campaign's ctx: %v", err)
	}
	if err := ld.Err(); err != nil {
		t.Fatalf("Err() = %v while leading", err)
	}
	if err := ld.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}

	// A wait is cut by its ctx.
	holder, err := g.Campaign(context.Background(), "e")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Resign(context.Background())
	wctx, wcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer wcancel()
	if _, err := g.Campaign(wctx, "e"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("campaign past its ctx: %v, want context.DeadlineExceeded", err)
	}
}

func TestCampaignRefusesSharedModes(t *testing.T) {
	g := newGuard(t, memory.New())
	for name, opt := range map[string]guard.LockOption{"read": guard.Read(), "permits": guard.Permits(2)} {
		if _, err := g.Campaign(context.Background(), "e", opt); !errors.Is(err, guard.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

// An election's name is checked as a key is, on its own: the "election:"
// its lock key adds is not the caller's to count.
func TestElectionNameIsChecked(t *testing.T) {
	g := newGuard(t, memory.New())
	ctx := context.Background()
	room := guard.MaxKeyLen - len("election:")
	for name, election := range map[string]string{
		"empty":         "",
		"too long":      strings.Repeat("e", room+1),
		"a control":     "e\n",
		"invalid UTF-8": "e\xff",
	} {
		if ld, err := g.Campaign(ctx, election, guard.NoWait()); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("Campaign, %s name: %v, want ErrInvalidKey", name, err)
			if ld != nil {
				ld.Resign(ctx)
			}
		}
		if _, err := g.Observe(ctx, election); !errors.Is(err, guard.ErrInvalidKey) {
			t.Errorf("Observe, %s name: %v, want ErrInvalidKey", name, err)
		}
	}
	_, err := g.Campaign(ctx, strings.Repeat("e", room+1))
	if want := fmt.Sprintf("more than %d", room); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("too long a name: %v, want it to say %q", err, want)
	}
	ld, err := g.Campaign(ctx, strings.Repeat("e", room), guard.NoWait())
	if err != nil {
		t.Fatalf("the longest name: %v", err)
	}
	ld.Resign(ctx)
}

// Campaigning again with the term's own context is refused: reentered,
// as a lock would be, it would be a second Leadership of the same term,
// whose Resign would give nothing up.
func TestCampaignWithinItsOwnTermIsRefused(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	g := newGuard(t, mem)
	ld, err := g.Campaign(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	again, err := g.Campaign(ld.Context(), "e", guard.NoWait())
	if !errors.Is(err, guard.ErrInvalidOption) || !strings.Contains(err.Error(), `lock "election:e"`) {
		t.Errorf("Campaign with the term's context: %v, want ErrInvalidOption naming the lock held", err)
	}
	if again != nil {
		if err := again.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if other, err := newGuard(t, mem).Campaign(ctx, "e", guard.NoWait()); err == nil {
			other.Resign(ctx)
		} else {
			t.Errorf("after Resign of the second Leadership, the seat is still taken: %v", err)
		}
	}
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// Campaign under a plain Lock of the election's key is refused as within a
// term is, and the error says what ctx holds: no term exists.
func TestCampaignWithinALockOfItsKeyIsRefused(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, memory.New())
	l, err := g.Lock(ctx, "election:e")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	_, err = g.Campaign(l.Context(), "e", guard.NoWait())
	if !errors.Is(err, guard.ErrInvalidOption) || strings.Contains(err.Error(), "term") || !strings.Contains(err.Error(), `lock "election:e"`) {
		t.Errorf("Campaign within a Lock of election:e: %v, want ErrInvalidOption naming the lock held, and no term", err)
	}
}

func TestLostTermCancelsTheLeader(t *testing.T) {
	f := newFaulty(t)
	g := newGuard(t, f, guard.WithTTL(300*time.Millisecond))
	ld, err := g.Campaign(context.Background(), "e")
	if err != nil {
		t.Fatal(err)
	}
	f.refreshBlock.Store(true)
	select {
	case <-ld.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("term not ended although its lease could not be renewed")
	}
	if !errors.Is(context.Cause(ld.Context()), guard.ErrLockLost) || !errors.Is(ld.Err(), guard.ErrLockLost) {
		t.Fatalf("cause %v, Err %v: want ErrLockLost", context.Cause(ld.Context()), ld.Err())
	}
}

func TestObserveFollowsTerms(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	mem := memory.New()
	a := newGuard(t, mem, guard.WithOwner("replica-a"), guard.WithTTL(time.Second))
	b := newGuard(t, mem, guard.WithOwner("replica-b"), guard.WithTTL(time.Second))
	seen, err := b.Observe(ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	next := func(want string) guard.Leader {
		t.Helper()
		select {
		case l := <-seen:
			if l.Owner != want {
				t.Fatalf("observed %+v, want owner %q", l, want)
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatalf("no leader change observed, waiting for %q", want)
		}
		return guard.Leader{}
	}
	if l := next(""); l.Term != 0 {
		t.Fatalf("empty seat observed as %+v", l)
	}
	la, err := a.Campaign(ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	if l := next("replica-a"); l.Term != la.Term() || l.TTL <= 0 || l.TTL > time.Second {
		t.Fatalf("observed %+v for term %d", l, la.Term())
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	next("")
	lb, err := b.Campaign(ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	if l := next("replica-b"); l.Term != lb.Term() {
		t.Fatalf("observed %+v for term %d", l, lb.Term())
	}
	cancel()
	for range seen {
	}
}

package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// RecordRemover is the part of an idempotency store that an operator's
// tool removes a record with: Delete (idempotency.Deleter), and Abandon
// for a claim in progress.
type RecordRemover interface {
	Delete(ctx context.Context, scope, key, owner string) error
	Abandon(ctx context.Context, scope, key, owner string) error
}

// HeldAndClaimed holds key on l and claims its record under scope "s" for
// owner "o" on st, the state OperatorChanges' calls are made against, and
// returns a func that reports whether the lock is held still (by one
// holder) and the record kept.
func HeldAndClaimed(t testing.TB, l interface {
	driver.Locker
	driver.Inspector
}, st idempotency.Store, key string) (still func() (held, kept bool)) {
	t.Helper()
	ctx := context.Background()
	if _, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, idempotency.Claim{Scope: "s", Key: key, Owner: "o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	return func() (bool, bool) {
		in, err := l.Inspect(ctx, key)
		_, gerr := st.Get(ctx, "s", key)
		return err == nil && len(in.Holders) == 1, gerr == nil
	}
}

// OperatorChanges are the calls an operator's tool makes to change what a
// backend keeps, by name: a forced release of key by l ("ForceRelease"),
// and by st, of key's record under scope "s", claimed by owner "o", the
// delete of whoever owns it ("Delete"), the delete of o's alone
// ("DeleteOwned", as the warden CLI deletes a record it showed), and the
// abandon ("Abandon").
func OperatorChanges(l driver.ForceReleaser, st RecordRemover, key string) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"ForceRelease": func(ctx context.Context) error {
			_, err := l.ForceRelease(ctx, key, driver.ReleaseTarget{AnyHolder: true})
			return err
		},
		"Delete":      func(ctx context.Context) error { return st.Delete(ctx, "s", key, "") },
		"DeleteOwned": func(ctx context.Context) error { return st.Delete(ctx, "s", key, "o") },
		"Abandon":     func(ctx context.Context) error { return st.Abandon(ctx, "s", key, "o") },
	}
}

// WantNotSent makes each of calls, changes that the server cannot have
// run (it is gone, or refuses them), and fails t for each whose error does
// not match driver.ErrNotSent.
func WantNotSent(t testing.TB, ctx context.Context, calls map[string]func(context.Context) error) {
	t.Helper()
	for name, call := range calls {
		err := call(ctx)
		t.Logf("%s: %v", name, err)
		if !errors.Is(err, driver.ErrNotSent) {
			t.Errorf("%s: %v, want an error matching driver.ErrNotSent", name, err)
		}
	}
}

// WantAnswerLostUnmarked makes call, a change sent through p, with every
// answer of the server held back by hold from then on, waits until done
// reports the change made on the server, and then tears down p's
// connections: the server ran the change, and its answer is lost. It
// fails t when call's error then is nil or matches driver.ErrNotSent. The
// requests call makes before the change (reads, a statement's prepare)
// are answered late, but answered; hold must be long enough for done to
// see the change made before its answer comes.
func WantAnswerLostUnmarked(t testing.TB, p *Proxy, hold time.Duration, call func() error, done func() bool) {
	t.Helper()
	p.Slow(hold)
	errc := make(chan error, 1)
	go func() { errc <- call() }()
	deadline := time.Now().Add(time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			p.Reset()
			t.Fatalf("the change was not made on the server within a minute (error: %v)", <-errc)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Reset()
	if err := <-errc; err == nil || errors.Is(err, driver.ErrNotSent) {
		t.Errorf("with its answer lost: %v, want an error not matching driver.ErrNotSent", err)
	}
}

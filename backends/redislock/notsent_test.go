package redislock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// heldAndClaimed holds key and claims its record on c (see
// drivertest.HeldAndClaimed).
func heldAndClaimed(t *testing.T, c goredis.UniversalClient, key string) {
	drivertest.HeldAndClaimed(t, newLocker(t, c), newStore(t, c), key)
}

// TestChangesRefusedMarkedNotSent: a forced release, a record's delete and
// its abandon that the server never got (its port closed), or refused
// whole (a read-only replica, a user denied EVALSHA), fail matching
// driver.ErrNotSent, and the lock and the record are kept.
func TestChangesRefusedMarkedNotSent(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	t.Cleanup(func() { admin.Close() })
	_, closedPort, _ := strings.Cut(drivertest.ClosedAddr(t), ":")
	for _, tc := range []struct {
		name   string
		opts   goredis.Options
		refuse []any // the admin's command that makes the server refuse, if any
	}{
		{name: "closed port", opts: goredis.Options{Addr: drivertest.ClosedAddr(t)}},
		{name: "denied EVALSHA", opts: goredis.Options{Addr: s.Addr(), Username: "denied", Password: "pw"},
			refuse: []any{"acl", "setuser", "denied", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval"}},
		{name: "read-only replica", opts: goredis.Options{Addr: s.Addr()}, refuse: []any{"replicaof", "127.0.0.1", closedPort}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := testKey(t)
			heldAndClaimed(t, admin, key)
			if tc.refuse != nil {
				if err := admin.Do(ctx, tc.refuse...).Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { admin.Do(ctx, "replicaof", "no", "one") })
			}
			c := goredis.NewClient(&tc.opts)
			t.Cleanup(func() { c.Close() })
			drivertest.WantNotSent(t, ctx, drivertest.OperatorChanges(newLocker(t, c), newStore(t, c), key))
			if in, err := newLocker(t, admin).Inspect(ctx, key); err != nil || len(in.Holders) != 1 {
				t.Errorf("after the refused changes: %+v, %v; want the lock held", in, err)
			}
			if _, err := newStore(t, admin).Get(ctx, "s", key); err != nil {
				t.Errorf("after the refused changes: %v; want the record kept", err)
			}
		})
	}
}

// TestChangesWithContextDoneMarkedNotSent: a forced release, a record's
// delete and its abandon asked with a context already done are never
// sent, and fail matching driver.ErrNotSent.
func TestChangesWithContextDoneMarkedNotSent(t *testing.T) {
	s := drivertest.StartRedis(t)
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	t.Cleanup(func() { c.Close() })
	key := testKey(t)
	l, st := newLocker(t, c), newStore(t, c)
	still := drivertest.HeldAndClaimed(t, l, st, key)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	drivertest.WantNotSent(t, ctx, drivertest.OperatorChanges(l, st, key))
	if held, kept := still(); !held || !kept {
		t.Errorf("after the changes with the context done: held %v, kept %v; want both", held, kept)
	}
}

// TestChangesUnansweredNotMarked: a change whose answer is lost after the
// server ran it (its answer held back by the proxy, the connection then
// reset) fails without driver.ErrNotSent.
func TestChangesUnansweredNotMarked(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	t.Cleanup(func() { admin.Close() })
	p := drivertest.StartProxy(t, s.Addr())
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
	t.Cleanup(func() { c.Close() })
	l, st := newLocker(t, c), newStore(t, c)
	// The server has the scripts, so that their digests alone are sent:
	// a NOSCRIPT answer held back would hold back the change itself.
	for _, src := range []string{l.s.forceReleaseBody, idemDeleteSrc, idemUpdateSrc} {
		if err := admin.ScriptLoad(ctx, src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for name, done := range map[string]func(key string) bool{
		"ForceRelease": func(key string) bool {
			in, err := newLocker(t, admin).Inspect(ctx, key)
			return err == nil && len(in.Holders) == 0
		},
		"Delete":      func(key string) bool { return admin.Exists(ctx, st.recordKey("s", key)).Val() == 0 },
		"DeleteOwned": func(key string) bool { return admin.Exists(ctx, st.recordKey("s", key)).Val() == 0 },
		"Abandon":     func(key string) bool { return admin.Exists(ctx, st.recordKey("s", key)).Val() == 0 },
	} {
		t.Run(name, func(t *testing.T) {
			p.Reset()
			key := testKey(t)
			heldAndClaimed(t, admin, key)
			f := drivertest.OperatorChanges(l, st, key)[name]
			drivertest.WantAnswerLostUnmarked(t, p, time.Second, func() error { return f(ctx) }, func() bool { return done(key) })
		})
	}
}

// TestRefusalInsideTheScriptNotMarked: a forced release whose script is
// refused a command it calls after it freed the lock (a user denied
// LINDEX, which finds the next waiter) fails without driver.ErrNotSent:
// the lock is freed. Redis 7.0 words such a refusal "ERR The user
// executing the script can't ...", 7.2 "ERR ACL failure in script: ...";
// with NOPERM's code, which a compatible server may give it (the hook
// rewrites the answer so), it must not pass for the refusal of the
// command itself, which runs nothing.
func TestRefusalInsideTheScriptNotMarked(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	t.Cleanup(func() { admin.Close() })
	if err := admin.Do(ctx, "acl", "setuser", "nolindex", "on", ">pw", "~*", "&*", "+@all", "-lindex").Err(); err != nil {
		t.Fatal(err)
	}
	for name, hook := range map[string]goredis.Hook{"server's words": nil, "as NOPERM": nopermWords{}} {
		t.Run(name, func(t *testing.T) {
			key := testKey(t)
			heldAndClaimed(t, admin, key)
			c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "nolindex", Password: "pw"})
			t.Cleanup(func() { c.Close() })
			if hook != nil {
				c.AddHook(hook)
			}
			_, err := newLocker(t, c).ForceRelease(ctx, key, driver.ReleaseTarget{AnyHolder: true})
			t.Logf("ForceRelease: %v", err)
			if err == nil || errors.Is(err, driver.ErrNotSent) {
				t.Errorf("ForceRelease refused inside its script: %v, want an error not matching driver.ErrNotSent", err)
			}
			if in, err := newLocker(t, admin).Inspect(ctx, key); err != nil || len(in.Holders) != 0 {
				t.Errorf("after the forced release refused inside its script: %+v, %v; want the lock freed", in, err)
			}
		})
	}
}

// nopermWords is a go-redis hook that gives a refusal raised inside a
// script (Redis 7.0's "ERR The user executing the script can't ...") the
// NOPERM code.
type nopermWords struct{}

func (nopermWords) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (nopermWords) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if goredis.HasErrorPrefix(err, "The user executing the script can't") {
			return errorReply("NOPERM " + strings.TrimPrefix(err.Error(), "ERR "))
		}
		return err
	}
}

func (nopermWords) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// errorReply is an error reply as go-redis gives one (goredis.Error).
type errorReply string

func (r errorReply) Error() string { return string(r) }
func (errorReply) RedisError()     {}

// TestReshardForceReleaseNotSent: a forced release whose lock's slot is
// migrating, with the lock's key still on the source node and its queue's
// nowhere, is answered TRYAGAIN, having run nothing, until its context
// ends (at the first such answer): it fails with the context's error
// marked driver.ErrNotSent, and the lock stays held.
func TestReshardForceReleaseNotSent(t *testing.T) {
	c := startReshardCluster(t, 2)
	cc := c.client()
	l := newLocker(t, cc)
	ctx := context.Background()
	short, cancel := context.WithCancel(ctx)
	defer cancel()
	cc.AddHook(cancelOnMigration{cancel})
	key := testKey(t)
	if _, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	slot := c.slot(mutexNamesOf(key).lock)
	src := c.owner(slot)
	first := true
	c.moveSlot(slot, src, c.other(src), 1, func() {
		if !first {
			return
		}
		first = false
		_, err := l.ForceRelease(short, key, driver.ReleaseTarget{AnyHolder: true})
		t.Logf("ForceRelease while the slot moves: %v", err)
		if !errors.Is(err, context.Canceled) || !errors.Is(err, driver.ErrNotSent) {
			t.Errorf("ForceRelease while the slot moves: %v, want the context's error matching driver.ErrNotSent", err)
		}
	})
	if in, err := l.Inspect(ctx, key); err != nil || len(in.Holders) != 1 {
		t.Errorf("after the forced release answered TRYAGAIN: %+v, %v; want the lock held", in, err)
	}
}

// cancelOnMigration is a go-redis hook that calls cancel once a command is
// answered as a slot migration answers (see migrating), so that a
// caller's context ends between such an answer and the next send.
type cancelOnMigration struct{ cancel context.CancelFunc }

func (cancelOnMigration) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h cancelOnMigration) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && migrating(err) {
			h.cancel()
		}
		return err
	}
}

func (cancelOnMigration) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// aclRules are the ACL rules the documentation gives a Redis user of
// warden under guard's, the Fence's and the Store's default prefixes: the
// commands sent and the ones the scripts call (a script's own calls are
// checked against the user's rights), the lock keys (each starts with its
// hash tag's '{'), the fence and idempotency keys, and the wake-up
// channels. TestDocumentedACL proves them, and that each is needed.
var aclRules = strings.Fields(`+evalsha +eval +evalsha_ro +eval_ro +ping +subscribe +unsubscribe +scan +get +set +del +exists
	+pexpire +pttl +time +publish +hget +hmget +hset +incrby
	+lindex +llen +lpop +lrange +lrem +rpush
	+zadd +zcard +zcount +zpopmin +zrange +zrangebyscore +zrem +zremrangebyscore +zscore
	~{warden:* ~warden:fence:* ~warden:idem:* &warden:wake:* &{warden:*`)

// TestDocumentedACL runs every operation of the Locker, the Fence and the
// Store as a user with aclRules alone (and the keys of the fenced writes,
// which are the application's): each succeeds, and the server denies
// nothing on the way, which its ACL LOG would show: not a release's
// wake-up (sent by pcall, so a refused one fails nothing) nor a waiter's
// subscription (refused, the waiter polls). Then, with each rule left out
// in turn (but UNSUBSCRIBE, see below), something fails or is denied.
func TestDocumentedACL(t *testing.T) {
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	ctx := context.Background()
	runs := 0
	run := func(t *testing.T, rules []string) []string {
		runs++
		args := []any{"acl", "setuser", "w", "reset", "on", ">pw", "~app:*"}
		for _, r := range rules {
			args = append(args, r)
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.Do(ctx, "acl", "log", "reset").Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		problems := exerciseAsUser(t, admin, s.Addr(), fmt.Sprintf("acl/%d/", runs))
		denied, err := admin.Do(ctx, "acl", "log").Slice()
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range denied {
			if e, ok := d.(map[any]any); ok {
				d = fmt.Sprintf("%v %v %v", e["reason"], e["context"], e["object"])
			}
			problems = append(problems, fmt.Sprintf("ACL LOG: %v", d))
		}
		return problems
	}
	for _, p := range run(t, aclRules) {
		t.Error(p)
	}
	if testing.Short() {
		return
	}
	for i, r := range aclRules {
		if r == "+unsubscribe" {
			// Sent only when a Locker drops, after it lingered, one of
			// several channels on its connection (the last one closes
			// the connection instead): no run here does.
			continue
		}
		t.Run("without "+r, func(t *testing.T) {
			problems := run(t, slices.Delete(slices.Clone(aclRules), i, i+1))
			if len(problems) == 0 {
				t.Errorf("nothing failed nor was denied without %s", r)
			}
		})
	}
}

// exerciseAsUser runs every operation as user w, password pw, on keys
// under prefix, and returns what failed. Its own keys and Lockers keep
// one run's subscriptions from being taken for the next's.
func exerciseAsUser(t *testing.T, admin *goredis.Client, addr, prefix string) (problems []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fail := func(what string, err error) bool {
		if err != nil {
			problems = append(problems, what+": "+err.Error())
		}
		return err != nil
	}
	var defers []func()
	defer func() {
		for _, f := range defers {
			f()
		}
	}()
	newGuard := func() *guard.Guard {
		c := goredis.NewClient(&goredis.Options{Addr: addr, Username: "w", Password: "pw"})
		l, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		defers = append(defers, func() { l.Close(); c.Close() })
		g, err := guard.New(l)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	holder := newGuard()
	fail("Ping", holder.Ping(ctx))
	for _, m := range []struct {
		name       string
		hold, wait []guard.LockOption
	}{
		{"plain", nil, nil},
		{"fair", []guard.LockOption{guard.Fair()}, []guard.LockOption{guard.Fair()}},
		{"read", []guard.LockOption{guard.Read()}, []guard.LockOption{guard.Write()}},
		{"write", []guard.LockOption{guard.Write()}, []guard.LockOption{guard.Read()}},
		{"semaphore", []guard.LockOption{guard.Permits(1)}, []guard.LockOption{guard.Permits(1)}},
	} {
		key := prefix + m.name
		lk, err := holder.Lock(ctx, key, append([]guard.LockOption{guard.NoWait(), guard.TTL(2 * time.Second)}, m.hold...)...)
		if fail(m.name+" Lock", err) {
			continue
		}
		// The waiter's own Locker subscribes to a channel of its own
		// (plain, fair) or to the key's: it is waiting, announced, once a
		// new channel has a subscriber, or once the server refused it.
		before := admin.PubSubChannels(ctx, "*").Val()
		waiter := newGuard()
		got := make(chan error, 1)
		go func() {
			l2, err := waiter.Lock(ctx, key, append([]guard.LockOption{guard.WaitAtMost(20 * time.Second), guard.TTL(2 * time.Second)}, m.wait...)...)
			if err == nil {
				err = l2.Unlock(ctx)
			}
			got <- err
		}()
		for {
			chans := admin.PubSubChannels(ctx, "*").Val()
			denied, _ := admin.Do(ctx, "acl", "log").Slice()
			if len(denied) > 0 || slices.ContainsFunc(chans, func(c string) bool { return !slices.Contains(before, c) }) {
				break
			}
			if ctx.Err() != nil {
				problems = append(problems, m.name+" waiter neither subscribed nor refused")
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if m.name == "fair" {
			// A fair waiter that gives up leaves the queue (dequeue.lua).
			_, _ = waiter.Lock(ctx, key, guard.Fair(), guard.WaitAtMost(50*time.Millisecond))
			// One that died while queued heads it: the release drops its
			// place (LPOP) and reserves the lock for the waiter behind.
			n := mutexNamesOf("warden:" + key)
			dead := "1000:warden:wake:nobody\ndead"
			admin.LPush(ctx, n.queue, dead)
			admin.ZAdd(ctx, n.deadlines, goredis.Z{Score: 1, Member: dead})
		}
		_, err = holder.Inspect(ctx, key)
		fail(m.name+" Inspect", err)
		fail(m.name+" Unlock", lk.Unlock(ctx))
		fail(m.name+" waiter", <-got)
	}
	lk, err := holder.Lock(ctx, prefix+"force", guard.NoWait())
	if !fail("Lock", err) {
		_, err = holder.ForceRelease(ctx, prefix+"force", guard.ReleaseTarget{AnyHolder: true})
		fail("ForceRelease", err)
		_ = lk.Unlock(ctx)
	}
	_, err = holder.List(ctx, prefix, "", 10)
	fail("List", err)

	c := goredis.NewClient(&goredis.Options{Addr: addr, Username: "w", Password: "pw"})
	defer c.Close()
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	lk, err = holder.Lock(ctx, prefix+"fence", guard.NoWait())
	if !fail("fenced Lock", err) {
		cl := fence.Of(lk)
		fail("Fence.Set", f.Set(ctx, cl, "app:s", "v", time.Minute))
		fail("Fence.HSet", f.HSet(ctx, cl, "app:h", "f", "v"))
		_, err = f.IncrBy(ctx, cl, "app:n", 1)
		fail("Fence.IncrBy", err)
		fail("Fence.Del", f.Del(ctx, cl, "app:s"))
		fail("Fence.Advance", f.Advance(ctx, cl))
		_, err = f.Highest(ctx, cl.Resource)
		fail("Fence.Highest", err)
		fail("fenced Unlock", lk.Unlock(ctx))
	}

	st, err := NewStore(c)
	if err != nil {
		t.Fatal(err)
	}
	fail("Store.Ping", st.Ping(ctx))
	const owner = "owner-0123456789abcdef"
	for _, k := range []string{"done", "abandoned"} {
		_, err := st.Claim(ctx, idempotency.Claim{Scope: "acl", Key: k, Fingerprint: "f", Owner: owner, Lease: time.Minute})
		if fail("Store.Claim", err) {
			continue
		}
		fail("Store.Extend", st.Extend(ctx, "acl", k, owner, time.Minute))
		if k == "abandoned" {
			fail("Store.Abandon", st.Abandon(ctx, "acl", k, owner))
			continue
		}
		fail("Store.Complete", st.Complete(ctx, "acl", k, owner, []byte("r"), time.Minute))
		_, err = st.Get(ctx, "acl", k)
		fail("Store.Get", err)
		fail("Store.Delete", st.Delete(ctx, "acl", k, owner))
	}
	return problems
}

// TestRefusedRecordKeepsHolder: a waiting contender's first attempt
// writes its grant and reads the state in one SET GET, finds the lock
// held, and records itself. When the record is refused (here a user
// without ZADD), the script fails there, and is not rolled back: the
// holder's state must have been written back before, so that the holder
// keeps the lock and nobody else is granted it.
func TestRefusedRecordKeepsHolder(t *testing.T) {
	ctx := context.Background()
	_, user := serverWithout(t, "+zadd")
	holder, waiter := user(), user()
	const key = "warden:refused/record" // within the rules' keys
	lease, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if w, err := waiter.Acquire(wctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true}); err == nil {
		t.Fatalf("the waiter was granted token %d over the holder's %d", w.Token(), lease.Token())
	}
	if n, err := user().Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err == nil {
		t.Errorf("a newcomer was granted token %d over the holder's %d", n.Token(), lease.Token())
	}
	if err := lease.Refresh(ctx, time.Minute); err != nil {
		t.Errorf("the holder's refresh after the refused record: %v", err)
	}
}

// TestReleaseRefusedWithoutRule: a release that hands the lock to a
// recorded waiter takes the waiter's record by pcall, where a moving
// slot's "non local key" is taken for an empty set; any other refusal (a
// user without ZPOPMIN) must fail the release, as a call would, rather
// than pass for nobody waiting.
func TestReleaseRefusedWithoutRule(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, user := serverWithout(t, "+zpopmin")
	holder, waiter := user(), user()
	const key = "warden:refused/release" // within the rules' keys
	lease, err := holder.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if w, err := waiter.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true}); err == nil {
			w.Release(context.Background())
		}
	}()
	_, waiters := lockWaitersOf(key)
	eventually(t, "the waiter recorded", func() bool { return admin.ZCard(ctx, waiters).Val() == 1 })
	if err := lease.Release(ctx); err == nil {
		t.Error("a release that could not take the waiter's record answered that it released")
	}
}

// serverWithout starts a server of the test's own with user w given
// aclRules but the one rule left out, and returns a client of its
// default user and a maker of Lockers of w.
func serverWithout(t *testing.T, rule string) (admin *goredis.Client, user func() *Locker) {
	t.Helper()
	s := drivertest.StartRedis(t)
	admin = goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	t.Cleanup(func() { admin.Close() })
	setUserWithout(t, admin, rule)
	return admin, func() *Locker {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "w", Password: "pw"})
		t.Cleanup(func() { c.Close() })
		return newLocker(t, c)
	}
}

// setUserWithout gives user w, password pw, aclRules but the one rule left
// out, in place of whatever rules it had.
func setUserWithout(t *testing.T, admin *goredis.Client, rule string) {
	t.Helper()
	args := []any{"acl", "setuser", "w", "reset", "on", ">pw"}
	for _, r := range aclRules {
		if r != rule {
			args = append(args, r)
		}
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestDocumentedACLCluster: on a Cluster, the documented rules with
// +cluster|slots and +command, which a ClusterClient sends to load its slot
// map and its commands' key positions, let a lock be taken, waited for and
// released, with no denial in any master's ACL LOG; without
// +cluster|slots, the acquisition fails.
func TestDocumentedACLCluster(t *testing.T) {
	c := startReshardCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, rules := range [][]string{append(slices.Clone(aclRules), "+cluster|slots", "+command"), append(slices.Clone(aclRules), "+command")} {
		for _, s := range c.shards {
			args := []any{"acl", "setuser", "w", "reset", "on", ">pw"}
			for _, r := range rules {
				args = append(args, r)
			}
			c.must(s, args...)
			c.must(s, "acl", "log", "reset")
		}
		user := func() *Locker {
			return newLocker(t, c.client(func(o *goredis.ClusterOptions) { o.Username, o.Password = "w", "pw" }))
		}
		key := fmt.Sprintf("warden:acl/cluster/%d", i)
		lease, err := user().Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
		if i == 1 {
			if err == nil {
				t.Error("an acquisition without +cluster|slots succeeded")
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			w, err := user().Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true})
			if err == nil {
				err = w.Release(ctx)
			}
			got <- err
		}()
		_, waiters := lockWaitersOf(key)
		owner := c.owner(c.slot(waiters))
		eventually(t, "the waiter recorded", func() bool { n, err := c.do(owner, "ZCARD", waiters).Int64(); return err == nil && n == 1 })
		if err := lease.Release(ctx); err != nil {
			t.Error(err)
		}
		if err := <-got; err != nil {
			t.Errorf("the waiter: %v", err)
		}
		for _, s := range c.shards {
			if denied, _ := c.do(s, "acl", "log").Slice(); len(denied) > 0 {
				t.Errorf("%s ACL LOG: %v", s.addr, denied)
			}
		}
	}
}

// TestListUnreadable: SCAN shows an ACL user every lock key, those its key
// patterns leave out too: a lock whose keys the server refuses to read to
// it is listed in its place with the refusal (NOPERM) as its Err, and
// those around it as they are, whether the refusal comes at the state's
// read or at the inspection (the lock's key allowed, its queue's not).
func TestListUnreadable(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	if err := admin.Do(ctx, "acl", "setuser", "ops", "on", ">pw", "+@all", "&*",
		"~{a}:*", "~{c}:*", "~{d}:lock").Err(); err != nil {
		t.Fatal(err)
	}
	holder := newLocker(t, admin)
	for _, k := range []string{"a", "b", "c", "d"} {
		if _, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	ops := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "ops", Password: "pw"})
	defer ops.Close()
	var got []string
	for after := ""; ; {
		page, err := newLocker(t, ops).List(ctx, "", after, 2)
		if err != nil {
			t.Fatalf("List after %q: %v", after, err)
		}
		for _, p := range page {
			switch unread := p.Key == "b" || p.Key == "d"; {
			case unread && (!goredis.IsPermissionError(p.Err) || !errors.Is(p.Err, driver.ErrUnavailable) || len(p.Holders) != 0):
				t.Errorf("lock %q, whose keys ops may not read: %+v, want no holders and an Err wrapping NOPERM and driver.ErrUnavailable", p.Key, p)
			case !unread && (p.Err != nil || len(p.Holders) != 1):
				t.Errorf("lock %q: %+v, want one holder and no Err", p.Key, p)
			}
			got = append(got, p.Key)
		}
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Key
	}
	if want := []string{"a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Fatalf("listed %q, want %q", got, want)
	}
}

// TestListCommandRefused: a user refused a command List sends (GET, or
// the four that run the inspection's script), whatever the key, is not refused
// one lock: the page fails with the server's refusal, rather than list
// every lock as unreadable.
func TestListCommandRefused(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	holder := newLocker(t, admin)
	for _, k := range []string{"a", "b"} {
		if _, err := holder.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	for _, rules := range [][]any{{"-get"}, {"-evalsha", "-eval", "-evalsha_ro", "-eval_ro"}} {
		args := append([]any{"acl", "setuser", "ops", "reset", "on", ">pw", "&*", "~*", "+@all"}, rules...)
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		ops := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "ops", Password: "pw"})
		page, err := newLocker(t, ops).List(ctx, "", "", 10)
		ops.Close()
		if page != nil || !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), "NOPERM") {
			t.Errorf("without %v: List = %+v, %v; want no page and the server's NOPERM", rules, page, err)
		}
	}
}

// TestListReadOnlyUser: a user allowed only to read the keys (%R~*), the
// least a listing needs, inspects and lists the locks it may read, where
// Redis 7 took the inspection's script for a write to them; a user with no
// key patterns at all still gets each lock as refused.
func TestListReadOnlyUser(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	holder := newLocker(t, admin)
	if _, err := holder.Acquire(ctx, "a", driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rules    []any
		readable bool
	}{{[]any{"%R~*"}, true}, {[]any{"resetkeys"}, false}} {
		args := append([]any{"acl", "setuser", "ops", "reset", "on", ">pw", "&*", "+@all"}, c.rules...)
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		ops := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "ops", Password: "pw"})
		l := newLocker(t, ops)
		in, ierr := l.Inspect(ctx, "a")
		page, err := l.List(ctx, "", "", 10)
		ops.Close()
		switch {
		case err != nil || len(page) != 1 || page[0].Key != "a":
			t.Errorf("%v: List = %+v, %v; want lock \"a\"", c.rules, page, err)
		case c.readable && (ierr != nil || len(in.Holders) != 1 || page[0].Err != nil || len(page[0].Holders) != 1):
			t.Errorf("%v: Inspect = %+v, %v; List = %+v; want one holder", c.rules, in, ierr, page)
		case !c.readable && (!goredis.IsPermissionError(ierr) || !goredis.IsPermissionError(page[0].Err)):
			t.Errorf("%v: Inspect = %+v, %v; List = %+v; want NOPERM", c.rules, in, ierr, page)
		}
	}
}

// TestReadOnlyUser: a user with the documented rules whose key patterns
// allow only reads (%R~) does all that reads: Ping, Inspect, List,
// Fence.Highest, and the Store's Ping and Get, where Redis 7 took the
// Store's reading script, run by EVALSHA, for a write to its key.
func TestReadOnlyUser(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	args := []any{"acl", "setuser", "ro", "on", ">pw"}
	for _, r := range aclRules {
		if strings.HasPrefix(r, "~") {
			r = "%R" + r
		}
		args = append(args, r)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := newLocker(t, admin).Acquire(ctx, "warden:a", driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	af, err := NewFence(admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := af.Advance(ctx, fence.Claim{Resource: "r", Token: 5}); err != nil {
		t.Fatal(err)
	}
	ro := goredis.NewClient(&goredis.Options{Addr: s.Addr(), Username: "ro", Password: "pw"})
	defer ro.Close()
	st := storeWithRecord(t, admin, ro)
	l := newLocker(t, ro)
	if err := l.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
	if in, err := l.Inspect(ctx, "warden:a"); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect = %+v, %v; want one holder", in, err)
	}
	if page, err := l.List(ctx, "", "", 10); err != nil || len(page) != 1 || len(page[0].Holders) != 1 {
		t.Errorf("List = %+v, %v; want lock \"warden:a\" held", page, err)
	}
	f, err := NewFence(ro)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := f.Highest(ctx, "r"); err != nil || h != 5 {
		t.Errorf("Fence.Highest = %d, %v; want 5", h, err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Errorf("Store.Ping: %v", err)
	}
	if rec, err := st.Get(ctx, "s", "k"); err != nil || string(rec.Response) != "done" {
		t.Errorf("Store.Get = %+v, %v; want the completed record", rec, err)
	}
}

// TestReadsWithoutReadOnlyScripts: on a server without EVALSHA_RO and
// EVAL_RO (Redis 6.2 has neither; here they are renamed away), Inspect
// and List run the inspection by EVALSHA, and the Store's Get its
// reading, and each Locker and Store asks for EVALSHA_RO once, not on
// every read.
func TestReadsWithoutReadOnlyScripts(t *testing.T) {
	ctx := context.Background()
	s := drivertest.StartRedis(t, "--rename-command", "evalsha_ro", "", "--rename-command", "eval_ro", "")
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer c.Close()
	l := newLocker(t, c)
	if _, err := l.Acquire(ctx, "a", driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if in, err := l.Inspect(ctx, "a"); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect = %+v, %v; want one holder", in, err)
	}
	if page, err := l.List(ctx, "", "", 10); err != nil || len(page) != 1 || len(page[0].Holders) != 1 {
		t.Errorf("List = %+v, %v; want lock \"a\" held", page, err)
	}
	st := storeWithRecord(t, c, c)
	if rec, err := st.Get(ctx, "s", "k"); err != nil || string(rec.Response) != "done" {
		t.Errorf("Store.Get = %+v, %v; want the completed record", rec, err)
	}
	// The server counts each unknown command it answers as an ERR reply.
	refused := func() string {
		_, rest, _ := strings.Cut(c.Info(ctx, "errorstats").Val(), "errorstat_ERR:count=")
		n, _, _ := strings.Cut(rest, "\r")
		return n
	}
	before := refused()
	for range 3 {
		if _, err := l.Inspect(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Get(ctx, "s", "k"); err != nil {
			t.Fatal(err)
		}
	}
	if after := refused(); after != before {
		t.Errorf("three more inspections and reads had %s refusals of ERR, after %s: EVALSHA_RO asked again", after, before)
	}
}

// storeWithRecord completes a record of key "k" in scope "s", response
// "done", through a Store on admin, and returns a Store on c.
func storeWithRecord(t *testing.T, admin, c *goredis.Client) *Store {
	t.Helper()
	ctx := context.Background()
	const owner = "owner-0123456789abcdef"
	as := newStore(t, admin)
	if _, err := as.Claim(ctx, idempotency.Claim{Scope: "s", Key: "k", Fingerprint: "f", Owner: owner, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := as.Complete(ctx, "s", "k", owner, []byte("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	return newStore(t, c)
}

// TestReadsRefusedReadOnlyScripts: a Redis 7 user allowed EVALSHA but
// not EVALSHA_RO inspects, lists and reads the Store's records by EVALSHA.
func TestReadsRefusedReadOnlyScripts(t *testing.T) {
	ctx := context.Background()
	admin, user := serverWithout(t, "+evalsha_ro")
	if _, err := newLocker(t, admin).Acquire(ctx, "warden:a", driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	l := user()
	if in, err := l.Inspect(ctx, "warden:a"); err != nil || len(in.Holders) != 1 {
		t.Errorf("Inspect = %+v, %v; want one holder", in, err)
	}
	if page, err := l.List(ctx, "", "", 10); err != nil || len(page) != 1 || len(page[0].Holders) != 1 {
		t.Errorf("List = %+v, %v; want lock \"warden:a\" held", page, err)
	}
	c := goredis.NewClient(&goredis.Options{Addr: admin.Options().Addr, Username: "w", Password: "pw"})
	defer c.Close()
	if rec, err := storeWithRecord(t, admin, c).Get(ctx, "s", "k"); err != nil || string(rec.Response) != "done" {
		t.Errorf("Store.Get = %+v, %v; want the completed record", rec, err)
	}
}

package redislock

import (
	"testing"
	"testing/synctest"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// TestWaitsReuseTheSubscription: a waiter that joins a confirmed
// subscription and leaves it costs no allocation once the subscription has
// served one (its wake-up channel and its linger are kept for the next),
// a wake-up the waiter left untaken does not reach the next one, and the
// subscription is dropped lingerFor after its last waiter left, not after
// an earlier one did.
func TestWaitsReuseTheSubscription(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNotifier(nil, func() {})
		defer n.close()
		// A connection that is not the notifier's: dropping the
		// subscription then sends nothing.
		ps := new(goredis.PubSub)
		s := &subscription{channel: "c", ps: ps, isReady: true, ready: make(chan struct{}),
			gone: make(chan struct{}), any: make(chan string, 1), named: make(map[string]chan string)}
		n.subs[s.channel] = s
		wait := func(id string) <-chan string {
			n.mu.Lock()
			defer n.mu.Unlock()
			return n.register(s, id)
		}
		subscribed := func() *subscription {
			n.mu.Lock()
			defer n.mu.Unlock()
			return n.subs[s.channel]
		}

		wait("a")
		n.deliver(ps, s.channel, "=7:9:1\na")
		n.leave(s, "a", false) // the grant untaken
		if c := wait("b"); len(c) != 0 {
			t.Fatalf("the next waiter found %q, a wake-up of the waiter before it", <-c)
		}
		n.leave(s, "b", false)
		if a := testing.AllocsPerRun(100, func() {
			wait("d")
			n.leave(s, "d", false)
		}); a != 0 {
			t.Errorf("a wait on a subscription that served one costs %v allocations, want 0", a)
		}

		time.Sleep(lingerFor / 2)
		wait("e")
		n.leave(s, "e", false)
		time.Sleep(lingerFor/2 + time.Millisecond)
		synctest.Wait()
		if subscribed() != s {
			t.Fatal("the subscription was dropped lingerFor after a waiter that was not its last left")
		}
		time.Sleep(lingerFor / 2)
		synctest.Wait()
		if subscribed() != nil {
			t.Fatal("the subscription was kept past lingerFor after its last waiter left")
		}
	})
}

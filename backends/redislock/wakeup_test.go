package redislock

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// subscribeVia is a client whose Pub/Sub connections go through another
// client's address.
type subscribeVia struct {
	*goredis.Client
	ps *goredis.Client
}

func (c subscribeVia) Subscribe(ctx context.Context, channels ...string) *goredis.PubSub {
	return c.ps.Subscribe(ctx, channels...)
}

// TestLostWakeupFallsBack: a waiter that cannot hear the release meant for
// it still takes the free lock, by itself, within a bound far below the
// holder's lease: within a fraction of the TTL when its subscription was
// confirmed and the message lost without a sign, and within a fraction of
// the handoff window when the subscription was never confirmed, or its
// connection was lost while the waiter slept (it polls until the
// subscription is confirmed). The holder's lease has 3s to run when it releases, and the
// waiter renews its record only every 20s, so neither of those timers ends
// the wait within the bound.
func TestLostWakeupFallsBack(t *testing.T) {
	addr := drivertest.Addr(t, addrEnv, addrDefault)
	const ttl = 3 * time.Second
	cases := []struct {
		name string
		// confirmed lets the subscription be confirmed before the loss;
		// cut closes its connection then.
		confirmed, cut bool
		bound          time.Duration
	}{
		{"message lost on a confirmed subscription", true, false, ttl / 2},
		{"subscription never confirmed", false, false, time.Second},
		{"connection lost while the waiter slept", true, true, ttl / 6},
	}
	for _, c := range cases {
		for _, fair := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fair=%v", c.name, fair), func(t *testing.T) {
				// The waiter's Pub/Sub connection goes through a proxy that
				// loses what the server sends, as a node that died or froze
				// without closing its connections would.
				proxy := drivertest.StartProxy(t, addr)
				if !c.confirmed {
					proxy.LoseReplies()
				}
				psClient := goredis.NewClient(&goredis.Options{Addr: proxy.Addr()})
				t.Cleanup(func() { psClient.Close() })
				holderClient := newClient(t)
				holder := newLocker(t, holderClient)
				waiter := newLocker(t, subscribeVia{Client: newClient(t), ps: psClient}, WithWaiterTimeout(time.Minute))
				ctx := context.Background()
				key := "lostwake-" + strconv.FormatInt(time.Now().UnixNano(), 36)
				opts := driver.AcquireOptions{TTL: ttl, Wait: true, Fair: fair}
				held, err := holder.Acquire(ctx, key, opts)
				if err != nil {
					t.Fatal(err)
				}
				type result struct {
					at  time.Time
					err error
				}
				granted := make(chan result, 1)
				go func() {
					wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					le, err := waiter.Acquire(wctx, key, opts)
					at := time.Now()
					if err == nil {
						err = le.Release(ctx)
					}
					granted <- result{at, err}
				}()
				n := namesOf(key)
				eventually(t, "the waiter recorded", func() bool {
					w, _ := holderClient.ZCard(ctx, n.waiters()).Result()
					q, _ := holderClient.LLen(ctx, n.queue()).Result()
					return w+q > 0
				})
				if c.confirmed {
					eventually(t, "the waiter's Locker subscribed", func() bool {
						subs, err := holderClient.PubSubNumSub(ctx, waiter.wake).Result()
						return err == nil && subs[waiter.wake] == 1
					})
					proxy.LoseReplies()
					if c.cut {
						proxy.Cut()
					}
				}
				released := time.Now()
				if err := held.Release(ctx); err != nil {
					t.Fatal(err)
				}
				r := <-granted
				if r.err != nil {
					t.Fatalf("the waiter, its wake-up lost: %v after %v", r.err, r.at.Sub(released).Round(time.Millisecond))
				}
				if took := r.at.Sub(released); took > c.bound {
					t.Fatalf("the waiter took the free lock %v after its release, more than %v", took.Round(time.Millisecond), c.bound)
				} else {
					t.Logf("the waiter took the free lock %v after its release", took.Round(time.Millisecond))
				}
			})
		}
	}
}

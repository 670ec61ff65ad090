package redislock

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// TestFairReleaseClockAge: the clock of this Locker's release is sent with
// its next fair attempt, for TIME, only while its age is a small part of
// the handoff window. That attempt's place is due early by the clock's
// age, and a head late renewing its place is told from one that is gone by
// that window: a clock 100ms old, within the sixteenth of the waiter
// timeout that bounds a plain lock's, but more than an eighth of the 250ms
// window, is not sent, and the attempt reads TIME.
func TestFairReleaseClockAge(t *testing.T) {
	for _, c := range []struct {
		age  time.Duration
		sent bool
	}{{100 * time.Millisecond, false}, {0, true}} {
		t.Run(c.age.String(), func(t *testing.T) {
			ctx := context.Background()
			admin := newClient(t)
			cl := newClient(t)
			h := &argsOf{first: make(chan []any, 1)}
			cl.AddHook(h)
			l := newLocker(t, cl)
			key := testKey(t)
			n := mutexNamesOf(key)
			h.sha = l.s.fairAcquire.Hash()
			now, err := admin.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			// Held by another for a minute.
			state := fmt.Sprintf("%d:4242:%d:0:other", now.UnixMilli()+60000, now.UnixMilli()/86400000+2)
			if err := admin.Set(ctx, n.lock, state, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			l.handedOff.Store(&handoff{key: key, at: time.Now().Add(-c.age), clock: now.UnixMilli()})
			actx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := l.Acquire(actx, key, driver.AcquireOptions{TTL: time.Minute, Wait: true, Fair: true})
				done <- err
			}()
			first := <-h.first
			cancel()
			<-done
			// KEYS 3, ARGV 7, and the clock as the 8th.
			if sent := len(first) == 3+3+8; sent != c.sent {
				t.Errorf("the release's clock, %v old: sent %v, want %v (the attempt's arguments %v)", c.age, sent, c.sent, first)
			}
		})
	}
}

// argsOf passes on the arguments of the first EVALSHA of the script sha.
type argsOf struct {
	sha   string
	once  sync.Once
	first chan []any
}

func (h *argsOf) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *argsOf) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == h.sha {
			h.once.Do(func() { h.first <- a })
		}
		return next(ctx, cmd)
	}
}

func (h *argsOf) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestFairReleaseOverMalformedPlace: a place at the head of the fair queue
// that carries a waiter timeout but no newline, of no shape warden writes,
// is taken for a place with no handoff window; it made every release fail,
// which left the lock held until its TTL ran out.
func TestFairReleaseOverMalformedPlace(t *testing.T) {
	ctx := context.Background()
	admin, l, key, n := lockOfTest(t)
	holder, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ghost(t, admin, key, "no-newline", 5*time.Second, 4*time.Second)
	// An attempt behind it announces the queue in the lock's state.
	r, err := run(ctx, l.sc, l.s.fairAcquire, []string{n.lock, n.queue, n.deadlines},
		"behind-owner", int64(10000), "1", int64(60000), int64(250), n.channel, "60000:warden:wake:nobody\nbehind-owner")
	if err != nil || r[0] != 0 {
		t.Fatalf("the attempt behind the holder: %v, %v", r, err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release with a malformed place at the head: %v", err)
	}
}

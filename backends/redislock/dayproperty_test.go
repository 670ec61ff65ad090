package redislock

import (
	"context"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestKeyCoversLeaseProperty runs seeded sequences of grants, renewals,
// batch renewals, releases and handovers to a waiter, plain and fair, with
// leases from a minute to days, on keys whose free state is set to expire
// at a random later day or deleted, as a user without PEXPIREAT. After
// every step the key, when present, expires, and not before the lease its
// state holds; tokens grow; no grant is made while a lease is held; and a
// held lease renews and releases. No lease is shorter than the run, so
// which steps run and what each must give depend on the seed alone.
func TestKeyCoversLeaseProperty(t *testing.T) {
	for _, seed := range []int64{1, 2, 3, 4} {
		t.Run(strconv.FormatInt(seed, 10), func(t *testing.T) {
			keyCoversLeaseRun(t, rand.New(rand.NewSource(seed)), 400)
		})
	}
}

// keyCoversLeaseRun is one sequence of TestKeyCoversLeaseProperty.
func keyCoversLeaseRun(t *testing.T, rng *rand.Rand, steps int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, user := serverWithout(t, "+pexpireat")
	ls := []*Locker{user(), user(), user()}
	ttls := []time.Duration{time.Minute, 23 * time.Hour, 25 * time.Hour, 47 * time.Hour, 49 * time.Hour, 72 * time.Hour, 200 * time.Hour}
	type held struct {
		lease driver.Lease
		l     *Locker
	}
	keys := []string{"warden:property/plain", "warden:property/fair"}
	holders := map[string]*held{}
	last := map[string]uint64{}
	granted := func(key string, l *Locker, lease driver.Lease, what string) {
		if lease.Token() <= last[key] {
			t.Errorf("%s: token %d after %d", what, lease.Token(), last[key])
		}
		last[key] = lease.Token()
		holders[key] = &held{lease, l}
	}
	ran := map[string]int{}
	defer func() { t.Logf("steps run: %v", ran) }()
	for i := range steps {
		k := rng.Intn(len(keys))
		key, fair := keys[k], k == 1
		h := holders[key]
		ttl := ttls[rng.Intn(len(ttls))]
		l := ls[rng.Intn(len(ls))]
		what, kind := "step "+strconv.Itoa(i), ""
		switch op := rng.Intn(6); {
		case op == 0 && h == nil:
			lock := lockKeyOf(key)
			if rng.Intn(4) == 0 {
				what += ": delete the key"
				kind = "delete"
				if err := admin.Del(ctx, lock).Err(); err != nil {
					t.Fatal(err)
				}
				break
			}
			// A free state whose key expires at the end of a day from
			// tomorrow to eight days on, as an earlier lease may have
			// left it: some leases then need a later day, some not.
			now, err := admin.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			day := now.UnixMilli()/dayMs + 1 + rng.Int63n(8)
			tok := "1"
			if v, err := admin.Get(ctx, lock).Result(); err == nil {
				tok = strings.Split(v, ":")[1]
			}
			kind = "free state"
			what += ": a free state until day " + strconv.FormatInt(day, 10)
			if err := admin.Do(ctx, "set", lock, "0:"+tok+":"+strconv.FormatInt(day, 10)+":0:", "pxat", day*dayMs).Err(); err != nil {
				t.Fatal(err)
			}
		case op == 1:
			kind = "acquire"
			what += ": acquire for " + ttl.String()
			lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Fair: fair})
			switch {
			case h != nil && err == nil:
				t.Errorf("%s: granted while another lease is held", what)
			case h == nil && err != nil:
				t.Errorf("%s: a free lock refused: %v", what, err)
			}
			if err == nil {
				granted(key, l, lease, what)
			}
		case op == 2 && h != nil:
			kind = "refresh"
			what += ": refresh for " + ttl.String()
			if err := h.lease.Refresh(ctx, ttl); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		case op == 3 && h != nil:
			kind = "batch refresh"
			what += ": batch refresh for " + ttl.String()
			if err := h.l.RefreshBatch(ctx, []driver.Lease{h.lease}, ttl)[0]; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		case op == 4 && h != nil:
			kind = "release"
			what += ": release"
			if err := h.lease.Release(ctx); err != nil {
				t.Errorf("%s: %v", what, err)
			}
			holders[key] = nil
		case op == 5 && h != nil:
			kind = "hand over"
			what += ": hand over for " + ttl.String()
			got := make(chan driver.Lease, 1)
			go func() {
				w, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Wait: true, Fair: fair})
				if err != nil {
					t.Errorf("%s: the waiter: %v", what, err)
				}
				got <- w
			}()
			m := mutexNamesOf(key)
			eventually(t, "the waiter recorded", func() bool {
				if fair {
					return admin.LLen(ctx, m.queue).Val() == 1
				}
				return admin.ZCard(ctx, m.waiters).Val() == 1
			})
			if err := h.lease.Release(ctx); err != nil {
				t.Errorf("%s: release: %v", what, err)
			}
			holders[key] = nil
			if w := <-got; w != nil {
				granted(key, l, w, what)
			}
		default:
			continue
		}
		ran[kind]++
		keyCovers(t, admin, key, what)
		if t.Failed() {
			t.FailNow()
		}
	}
}

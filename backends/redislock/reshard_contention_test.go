package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

// sectionCheck judges the sections of the holders of one key: how many
// were inside at once, and the order of their tokens.
type sectionCheck struct {
	mu     sync.Mutex
	inside int
	// exclusive says the one inside holds an exclusive lease.
	exclusive                            bool
	last                                 uint64 // the greatest token seen
	seen                                 map[uint64]bool
	grants, overlaps, backwards, repeats int
}

// enter records a section under a lease with token; limit is how many
// holders may be inside at once (an exclusive lease's 1, a semaphore's
// permits).
func (s *sectionCheck) enter(token uint64, exclusive bool, limit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.grants++
	if s.exclusive || (exclusive && s.inside > 0) || s.inside >= limit {
		s.overlaps++
	}
	// Every lease granted before an exclusive one was released before it
	// was granted.
	if exclusive && token <= s.last {
		s.backwards++
	}
	if s.seen[token] {
		s.repeats++
	}
	s.seen[token] = true
	s.last = max(s.last, token)
	s.inside++
	s.exclusive = exclusive
}

func (s *sectionCheck) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inside--
	s.exclusive = false
}

func (s *sectionCheck) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grants
}

// errorLog keeps the errors of a run, the first few in full.
type errorLog struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (e *errorLog) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if len(e.first) < 10 {
		e.first = append(e.first, fmt.Sprintf(format, args...))
	}
}

// busyKey is a key the contenders of TestReshardContention take in turns.
type busyKey struct {
	name string
	// take acquires the i-th lease of a contender, waiting; exclusive says
	// whether it is an exclusive one, limit how many may hold it at once.
	take func(ctx context.Context, l *Locker, key string, i int) (lease driver.Lease, exclusive bool, limit int, err error)
	// fenced: the holders increment a fenced counter with their tokens.
	fenced bool
}

// TestReshardContention: contenders, each with a client and a Locker of
// its own as separate processes have, take a lease of every kind (plain,
// fair, read/write, a semaphore of two permits) in turns, while the slots
// of the keys move from master to master a key at a time, a master is
// added and the slots moved onto it, then off it, and it is removed. No
// two holders overlap (no more than two for the semaphore, no reader with
// a writer), every exclusive grant's token is greater than every token
// before it, no token repeats, a counter the plain lock's holders
// increment through the Fence with their tokens refuses none and ends at
// the number of their sections, no call fails, and every key is granted
// again after the master is removed.
func TestReshardContention(t *testing.T) {
	c := startReshardCluster(t, 3)
	const (
		contenders = 6
		ttl        = 10 * time.Second
	)
	opts := driver.AcquireOptions{TTL: ttl, Wait: true}
	keys := []busyKey{
		{name: "plain", fenced: true, take: func(ctx context.Context, l *Locker, key string, _ int) (driver.Lease, bool, int, error) {
			le, err := l.Acquire(ctx, key, opts)
			return le, true, 1, err
		}},
		{name: "fair", take: func(ctx context.Context, l *Locker, key string, _ int) (driver.Lease, bool, int, error) {
			le, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: ttl, Wait: true, Fair: true})
			return le, true, 1, err
		}},
		{name: "rw", take: func(ctx context.Context, l *Locker, key string, i int) (driver.Lease, bool, int, error) {
			if i%3 == 0 {
				le, err := l.AcquireWrite(ctx, key, opts)
				return le, true, 1, err
			}
			le, err := l.AcquireRead(ctx, key, opts)
			return le, false, contenders, err
		}},
		{name: "semaphore", take: func(ctx context.Context, l *Locker, key string, _ int) (driver.Lease, bool, int, error) {
			le, err := l.AcquireSemaphore(ctx, key, 2, opts)
			return le, false, 2, err
		}},
	}
	checks := make([]*sectionCheck, len(keys))
	for i := range checks {
		checks[i] = &sectionCheck{seen: map[uint64]bool{}}
	}
	var errs errorLog
	var fencedOK, fencedStale atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for range contenders {
		cc := c.client()
		l := newLocker(t, cc)
		f, err := NewFence(cc)
		if err != nil {
			t.Fatal(err)
		}
		for j, k := range keys {
			key := "reshard/busy/" + k.name
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					actx, cancel := context.WithTimeout(ctx, 30*time.Second)
					le, exclusive, limit, err := k.take(actx, l, key, i)
					cancel()
					if ctx.Err() != nil {
						if err == nil {
							le.Release(context.Background())
						}
						return
					}
					if err != nil {
						errs.add("%s: acquire: %v", k.name, err)
						continue
					}
					checks[j].enter(le.Token(), exclusive, limit)
					// The section's calls do not end with the run: a
					// write cut short may have been applied.
					sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					if k.fenced {
						_, err := f.IncrBy(sctx, fence.Claim{Resource: "{" + key + "}", Token: le.Token()}, "{"+key+"}:count", 1)
						switch {
						case err == nil:
							fencedOK.Add(1)
						case errors.Is(err, fence.ErrStaleToken):
							fencedStale.Add(1)
						default:
							errs.add("%s: fenced write: %v", k.name, err)
						}
					}
					if i%2 == 0 {
						if err := le.Refresh(sctx, ttl); err != nil {
							errs.add("%s: refresh: %v", k.name, err)
						}
					}
					checks[j].leave()
					if err := le.Release(sctx); err != nil {
						errs.add("%s: release: %v", k.name, err)
					}
					cancel()
				}
			})
		}
	}

	moves := 0
	// The shape of a busy slot's move: the contenders act between batches.
	pause := func() { time.Sleep(2 * time.Millisecond) }
	moveAll := func(to func(*shard) *shard) {
		for _, k := range keys {
			slot := c.slot(lockKeyOf("reshard/busy/" + k.name))
			src := c.owner(slot)
			if dst := to(src); dst != src {
				c.moveSlot(slot, src, dst, 1, pause)
				moves++
			}
		}
	}
	grantedAgain := func(what string) {
		t.Helper()
		before := make([]int, len(keys))
		for i, s := range checks {
			before[i] = s.count()
		}
		eventually(t, "every key granted 3 times "+what, func() bool {
			for i, s := range checks {
				if s.count() < before[i]+3 {
					return false
				}
			}
			return true
		})
	}
	grantedAgain("at the start")
	for range 3 {
		moveAll(c.other)
	}
	d := c.add()
	moveAll(func(*shard) *shard { return d })
	grantedAgain("on the added master")
	moveAll(func(*shard) *shard { return c.shards[0] })
	c.remove(d)
	grantedAgain("after the master was removed")
	stop()
	wg.Wait()

	for i, s := range checks {
		t.Logf("%s: %d grants, %d overlaps, %d tokens not past the last, %d repeated", keys[i].name, s.grants, s.overlaps, s.backwards, s.repeats)
		if s.overlaps+s.backwards+s.repeats > 0 {
			t.Errorf("%s: %d overlaps, %d tokens not past the last, %d repeated", keys[i].name, s.overlaps, s.backwards, s.repeats)
		}
	}
	t.Logf("%d slot moves; fenced writes: %d accepted, %d refused as stale", moves, fencedOK.Load(), fencedStale.Load())
	if fencedStale.Load() > 0 {
		t.Errorf("%d fenced writes of holders refused as stale", fencedStale.Load())
	}
	const plainKey = "reshard/busy/plain"
	if n, err := c.client().Get(context.Background(), "{"+plainKey+"}:count").Int64(); err != nil || n != fencedOK.Load() {
		t.Errorf("the fenced counter is %d (%v), want the %d writes accepted", n, err, fencedOK.Load())
	}
	if errs.n > 0 {
		t.Errorf("%d calls failed, the first: %v", errs.n, errs.first)
	}
}

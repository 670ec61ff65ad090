package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// clockReuse is how long a waiter's probes take a node's clock as read
// last, moved on by the local monotonic time elapsed since, before they
// read it again: a clock stepped meanwhile misleads a probe for that long
// at most.
const clockReuse = time.Second

// nodeClock is a node's clock as a waiter's probe read it.
type nodeClock struct {
	ms int64     // the node's clock, ms since the Unix epoch
	at time.Time // when its answer came back, on our clock; zero: not read
}

// now is the node's clock at t as c estimates it, or false when c is not
// to be used at t. It is at most the node's clock, but for drift: the
// node read it before its answer came back.
func (c nodeClock) now(t time.Time) (int64, bool) {
	if c.at.IsZero() || t.Sub(c.at) >= clockReuse {
		return 0, false
	}
	return c.ms + t.Sub(c.at).Milliseconds(), true
}

// probeAnswer is a node's answer to a probe: its state as probeState
// judges it, and its clock when the probe read it.
type probeAnswer struct {
	state int64
	clock nodeClock
}

// probeNodes asks the nodes whether they would grant a vote for lock,
// writing nothing: free when a majority would, and otherwise how long the
// holder's votes still last. A node that fails counts against a majority.
// When so many refuse the read for good (an ACL user without GET; see
// redisrefusal) that no majority can answer it, it returns errRefused with
// the first refusal: no later probe would do better.
//
// It reads each node's state, a GET, and judges whether the vote there
// lapsed by the node's clock: a TIME in the same round trip (where a
// script cost three commands: the script, GET and TIME), or, for a second
// after that, the clock as read then (clocks, the waiter's, which
// probeNodes updates), moved on by the time elapsed here. Only the
// waiter's pause and its decision to vote follow from that, and the vote
// judges the node's state on the node's clock, so a clock misjudged (a
// node's clock stepped within that second) costs a vote refused, or a
// longer wait, for that second at most, never safety.
//
// It asks a majority of the nodes first, taking each Locker's probes
// round the nodes: under contention the lock is held there, which settles
// it, so that a probe costs a majority's reads, not every node's. The
// other nodes are asked only when the first leave a majority of free nodes
// possible and unproven (some answered free, not all of them), or when
// some of the first refused the read for good: the others may refuse it
// too, and a majority of refusals ends the wait, where the first alone,
// held, would leave it to its context's end. A node that
// failed its last vote or probe is asked first only when too few others
// are left: one that does not answer holds every round it is part of to
// the node timeout, and would hold up the waiter's turn once the lock is
// free.
func (l *Locker) probeNodes(ctx context.Context, lock string, clocks []nodeClock) (hint time.Duration, free bool, err error) {
	// The calls read a copy: one that finishes in the background, its
	// round over, must not read clocks while this goroutine writes them.
	known := slices.Clone(clocks)
	probe := func(ctx context.Context, i int) (any, error) {
		if now, ok := known[i].now(time.Now()); ok {
			v, err := l.nodes[i].Get(ctx, lock).Result()
			if errors.Is(err, goredis.Nil) {
				return probeAnswer{state: 1}, nil
			}
			if err != nil {
				return nil, err
			}
			return probeAnswer{state: probeState(v, now)}, nil
		}
		pipe := l.nodes[i].Pipeline()
		get, clock := pipe.Get(ctx, lock), pipe.Time(ctx)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
			return nil, err
		}
		t, err := clock.Result()
		if err != nil {
			return nil, err
		}
		a := probeAnswer{state: 1, clock: nodeClock{ms: t.UnixMilli(), at: time.Now()}}
		v, err := get.Result()
		if errors.Is(err, goredis.Nil) {
			return a, nil
		}
		if err != nil {
			return nil, err
		}
		a.state = probeState(v, a.clock.ms)
		return a, nil
	}
	n := len(l.nodes)
	first := int(l.probes.Add(1) % uint32(n))
	yes, refused := 0, 0
	var refusal error
	tally := func(which []int, rs []result) {
		nr, why := refusals(rs)
		if refused += nr; refusal == nil {
			refusal = why
		}
		for j, r := range rs {
			if r.err != nil {
				l.silent[which[j]].Store(true)
				continue
			}
			a := r.val.(probeAnswer)
			l.silent[which[j]].Store(false)
			if !a.clock.at.IsZero() {
				clocks[which[j]] = a.clock
			}
			if a.state == 1 {
				yes++
			} else if p := time.Duration(-a.state) * time.Millisecond; p > 0 && (hint == 0 || p < hint) {
				hint = p
			}
		}
	}
	which, rest := l.probeOrder(first)
	tally(which, l.gather(ctx, probe, nil, which, nil))
	if yes > 0 && yes < l.quorum || refused > 0 {
		tally(rest, l.gather(ctx, probe, nil, rest, nil))
	}
	if refused > n-l.quorum {
		return 0, false, fmt.Errorf("%w (%d of %d): %w", errRefused, refused, n, refusal)
	}
	return hint, yes >= l.quorum, nil
}

// probeOrder splits the nodes, from first round the ring, into the
// majority a probe asks first and the rest: those that did not fail their
// last call first, in ring order.
func (l *Locker) probeOrder(first int) (which, rest []int) {
	turn := l.ring[first : first+len(l.nodes)]
	silent := 0
	for _, i := range turn[:l.quorum] {
		if l.silent[i].Load() {
			silent++
		}
	}
	if silent == 0 {
		return turn[:l.quorum], turn[l.quorum:]
	}
	// Read once: a flag that changed between two passes would put its
	// node in both, or in neither.
	order, later := make([]int, 0, len(turn)), make([]int, 0, len(turn))
	for _, i := range turn {
		if l.silent[i].Load() {
			later = append(later, i)
		} else {
			order = append(order, i)
		}
	}
	order = append(order, later...)
	return order[:l.quorum], order[l.quorum:]
}

// probeState reads a node's state v (see state.lua) for a waiter's probe:
// 1 when the node would grant a vote, else 0 less how long the holder's
// vote still lasts in ms (0 when unknown: a value of another format). now
// is the node's clock (ms since the Unix epoch): the waiter's own clock,
// apart from the node's, would make it wait longer by the difference for
// a vote that lapsed (its holder gone), or vote early, to be refused.
func probeState(v string, now int64) int64 {
	d, _, ok := strings.Cut(v, ":")
	if !ok {
		return 0
	}
	if d == "0" {
		return 1
	}
	deadline, err := strconv.ParseInt(d, 10, 64)
	if err != nil {
		return 0
	}
	if left := deadline - now; left > 0 {
		return -left
	}
	return 1
}

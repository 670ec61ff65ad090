package redlock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// probeNodes asks the nodes whether they would grant a vote for lock,
// writing nothing: free when a majority would, and otherwise how long the
// holder's votes still last. A node that fails counts against a majority.
// It reads each node's state and clock, a GET and a TIME in one round trip,
// where a script cost three commands (the script, GET and TIME; see
// probeState). It asks a majority of the nodes first, taking each Locker's
// probes round the nodes: under contention the lock is held there, which
// settles it, so that a probe costs a majority's reads, not every node's.
// The other nodes are asked only when the first leave a majority of free
// nodes possible and unproven: some answered free, not all of them.
func (l *Locker) probeNodes(ctx context.Context, lock string) (hint time.Duration, free bool) {
	probe := func(ctx context.Context, i int) (any, error) {
		pipe := l.nodes[i].Pipeline()
		get, clock := pipe.Get(ctx, lock), pipe.Time(ctx)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
			return nil, err
		}
		v, err := get.Result()
		if errors.Is(err, goredis.Nil) {
			return int64(1), nil
		}
		if err != nil {
			return nil, err
		}
		now, err := clock.Result()
		if err != nil {
			return nil, err
		}
		return probeState(v, now), nil
	}
	n := len(l.nodes)
	first := int(l.probes.Add(1) % uint32(n))
	yes := 0
	tally := func(rs []result) {
		for _, r := range rs {
			if r.err != nil {
				continue
			}
			if v := r.val.(int64); v == 1 {
				yes++
			} else if p := time.Duration(-v) * time.Millisecond; p > 0 && (hint == 0 || p < hint) {
				hint = p
			}
		}
	}
	tally(l.gather(ctx, probe, nil, l.ring[first:first+l.quorum], nil))
	if yes > 0 && yes < l.quorum {
		tally(l.gather(ctx, probe, nil, l.ring[first+l.quorum:first+n], nil))
	}
	return hint, yes >= l.quorum
}

// probeState reads a node's state v (see state.lua) for a waiter's probe:
// 1 when the node would grant a vote, else 0 less how long the holder's
// vote still lasts in ms (0 when unknown: a value of another format). now
// is the node's clock, read with the state: the waiter's own clock, apart
// from the node's, would make it wait longer by the difference for a vote
// that lapsed (its holder gone), or vote early, to be refused.
func probeState(v string, now time.Time) int64 {
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
	if left := deadline - now.UnixMilli(); left > 0 {
		return -left
	}
	return 1
}

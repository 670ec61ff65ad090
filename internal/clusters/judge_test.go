//go:build clusters

package clusters

import (
	"container/heap"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// event is a fault injected into a cluster (or the start of the workload),
// with the moment the cluster could serve again after it: a new leader
// elected, a replica promoted, a node back. The lock must be granted again
// within the TTL of the fault, or a second after the cluster serves again
// when that comes later, plus a second either way.
type event struct {
	name  string
	at    time.Time
	ready time.Time // zero: the cluster never stopped serving
}

func (e event) bound(ttl time.Duration) time.Duration {
	b := ttl
	if !e.ready.IsZero() {
		b = max(b, e.ready.Sub(e.at))
	}
	return b + time.Second
}

type eventVerdict struct {
	event
	unavailable time.Duration // longest time without a grant after the event
	bound       time.Duration
}

// verdict is one row of the summary table, with what it failed.
type verdict struct {
	scenario     string
	cycles       int // grants, so critical sections run
	accepted     int // fenced writes accepted
	refused      int // fenced writes refused
	overlaps     int // accepted writes that followed another section's write since their read
	outOfOrder   int // grants whose token was not above that of a section that had already ended
	doubleGrants int // sections that started while another was still running (informative)
	longest      time.Duration
	events       []eventVerdict
	failures     []string
	notes        []string
}

// judge applies the rules to a scenario's history. stop is when the workers
// were told to stop: the last event's window ends there.
func judge(scenario string, sections []section, accepted, refused, overlapCount int, overlaps []string,
	events []event, ttl time.Duration, stop time.Time) verdict {
	v := verdict{scenario: scenario, cycles: len(sections), accepted: accepted, refused: refused, overlaps: overlapCount}
	if overlapCount > 0 {
		v.failures = append(v.failures, fmt.Sprintf("%d writes were accepted from sections that overlapped another's: %s",
			overlapCount, strings.Join(overlaps, "; ")))
	}

	byGrant := slices.Clone(sections)
	for i := range byGrant {
		if byGrant[i].ended.IsZero() {
			byGrant[i].ended = stop
		}
	}
	slices.SortStableFunc(byGrant, func(a, b section) int { return a.granted.Compare(b.granted) })

	// Tokens: a grant must carry a token above every token of the sections
	// that had ended before it started.
	var running endHeap
	var top *section
	var ooo []string
	for i := range byGrant {
		s := &byGrant[i]
		for running.Len() > 0 && running[0].ended.Before(s.granted) {
			done := heap.Pop(&running).(*section)
			if top == nil || done.token > top.token {
				top = done
			}
		}
		if top != nil && s.token <= top.token {
			v.outOfOrder++
			if len(ooo) < 10 {
				ooo = append(ooo, fmt.Sprintf("section %d (worker %d) got token %d at %s, after section %d (worker %d) had ended holding token %d",
					s.id, s.worker, s.token, s.granted.Format("15:04:05.000"), top.id, top.worker, top.token))
			}
		}
		heap.Push(&running, s)
	}
	if v.outOfOrder > 0 {
		v.failures = append(v.failures, fmt.Sprintf("%d grants whose token was not above an earlier, finished section's: %s",
			v.outOfOrder, strings.Join(ooo, "; ")))
	}

	// Double grants: informative, since a holder that cannot know its
	// lock is gone (a Redis failover to a replica that missed the grant)
	// is what fencing is for; the fence and the overlap rule judge them.
	var lastEnd time.Time
	var worst time.Duration
	for _, s := range byGrant {
		if s.granted.Before(lastEnd) {
			v.doubleGrants++
			worst = max(worst, lastEnd.Sub(s.granted))
		}
		if s.ended.After(lastEnd) {
			lastEnd = s.ended
		}
	}
	if v.doubleGrants > 0 {
		v.notes = append(v.notes, fmt.Sprintf("%d sections started while another still ran (longest overlap %v)",
			v.doubleGrants, worst.Round(time.Millisecond)))
	}

	// Availability: within each event's window (up to the next event, or
	// the stop), the longest stretch without a grant, counted from the
	// event.
	grants := make([]time.Time, len(byGrant))
	for i, s := range byGrant {
		grants[i] = s.granted
	}
	evs := slices.Clone(events)
	slices.SortStableFunc(evs, func(a, b event) int { return a.at.Compare(b.at) })
	for i, e := range evs {
		end := stop
		if i+1 < len(evs) {
			end = evs[i+1].at
		}
		prev, longest := e.at, time.Duration(0)
		for _, g := range grants {
			if !g.After(e.at) {
				continue
			}
			if !g.Before(end) {
				break
			}
			longest = max(longest, g.Sub(prev))
			prev = g
		}
		longest = max(longest, end.Sub(prev))
		ev := eventVerdict{event: e, unavailable: longest, bound: e.bound(ttl)}
		v.events = append(v.events, ev)
		v.longest = max(v.longest, longest)
		if longest > ev.bound {
			v.failures = append(v.failures, fmt.Sprintf("after %q the lock went %v without a grant, more than %v",
				e.name, longest.Round(time.Millisecond), ev.bound.Round(time.Millisecond)))
		}
	}
	return v
}

// endHeap orders running sections by when they ended.
type endHeap []*section

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i].ended.Before(h[j].ended) }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(*section)) }
func (h *endHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// TestJudgesCatchViolations feeds the store and the judges histories that
// break each rule, without servers, so that a clean table means the rules
// were checked rather than that they cannot fail.
func TestJudgesCatchViolations(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// step is one operation on the store: a grant (begin), a read, a
	// write of the value read plus one, or an end.
	type step struct {
		op     string
		worker int
		token  uint64
		ms     int
	}
	cases := []struct {
		name     string
		steps    []step
		events   []event
		stop     int
		want     []string
		overlaps int
		ooo      int
		refused  int
	}{
		{
			name: "clean handoff",
			steps: []step{
				{"begin", 0, 10, 0}, {"read", 0, 0, 1}, {"write", 0, 0, 2}, {"write", 0, 0, 3}, {"end", 0, 0, 4},
				{"begin", 1, 11, 5}, {"read", 1, 0, 6}, {"write", 1, 0, 7}, {"write", 1, 0, 8}, {"end", 1, 0, 9},
			},
			stop: 10,
		},
		{
			// The stale holder writes after the new one read but before it
			// wrote: the fence cannot know, both writes are accepted.
			name: "lost update the fence cannot stop",
			steps: []step{
				{"begin", 0, 10, 0}, {"read", 0, 0, 1},
				{"begin", 1, 11, 2}, {"read", 1, 0, 3},
				{"write", 0, 0, 4}, {"write", 1, 0, 5}, {"end", 0, 0, 6}, {"end", 1, 0, 7},
			},
			stop:     8,
			want:     []string{"overlapped another's"},
			overlaps: 1,
		},
		{
			// The new holder writes first: the stale one's later write is
			// refused, which is what the token is for.
			name: "stale write refused",
			steps: []step{
				{"begin", 0, 10, 0}, {"read", 0, 0, 1},
				{"begin", 1, 11, 2}, {"read", 1, 0, 3}, {"write", 1, 0, 4},
				{"write", 0, 0, 5}, {"end", 0, 0, 6}, {"end", 1, 0, 7},
			},
			stop:    8,
			refused: 1,
		},
		{
			name: "token went back",
			steps: []step{
				{"begin", 0, 10, 0}, {"read", 0, 0, 1}, {"write", 0, 0, 2}, {"end", 0, 0, 3},
				{"begin", 1, 9, 4}, {"read", 1, 0, 5}, {"write", 1, 0, 6}, {"end", 1, 0, 7},
			},
			stop:    8,
			want:    []string{"not above an earlier"},
			ooo:     1,
			refused: 1,
		},
		{
			name: "token repeated",
			steps: []step{
				{"begin", 0, 10, 0}, {"end", 0, 0, 1},
				{"begin", 1, 10, 2}, {"end", 1, 0, 3},
			},
			stop: 4,
			want: []string{"not above an earlier"},
			ooo:  1,
		},
		{
			name: "no grant for too long after a fault",
			steps: []step{
				{"begin", 0, 10, 0}, {"end", 0, 0, 10},
				{"begin", 1, 11, 4000}, {"end", 1, 0, 4010},
			},
			events: []event{{name: "kill", at: at(100), ready: at(600)}},
			stop:   4100,
			want:   []string{`after "kill" the lock went 3.9s without a grant, more than 3s`},
		},
		{
			name: "slow election extends the bound",
			steps: []step{
				{"begin", 0, 10, 0}, {"end", 0, 0, 10},
				{"begin", 1, 11, 4000}, {"end", 1, 0, 4010},
			},
			events: []event{{name: "kill", at: at(100), ready: at(3500)}},
			stop:   4100,
		},
		{
			name: "stall until the stop",
			steps: []step{
				{"begin", 0, 10, 0}, {"end", 0, 0, 10},
			},
			events: []event{{name: "stop", at: at(100)}},
			stop:   5000,
			want:   []string{`after "stop" the lock went 4.9s`},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var store fencedCounter
			open := map[int]*section{}
			vals := map[int]int64{}
			for _, st := range c.steps {
				switch st.op {
				case "begin":
					open[st.worker] = store.begin(st.worker, st.token, at(st.ms))
				case "read":
					vals[st.worker] = store.read(open[st.worker])
				case "write":
					vals[st.worker]++
					store.write(open[st.worker], vals[st.worker])
				case "end":
					store.end(open[st.worker], at(st.ms))
				}
			}
			sections, accepted, refused, overlapCount, overlaps := store.snapshot()
			v := judge(c.name, sections, accepted, refused, overlapCount, overlaps, c.events, 2*time.Second, at(c.stop))
			if v.overlaps != c.overlaps || v.outOfOrder != c.ooo || v.refused != c.refused {
				t.Errorf("overlaps %d, out of order %d, refused %d; want %d, %d, %d",
					v.overlaps, v.outOfOrder, v.refused, c.overlaps, c.ooo, c.refused)
			}
			got := strings.Join(v.failures, "\n")
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("failures %q do not say %q", got, w)
				}
			}
			if len(c.want) == 0 && len(v.failures) > 0 {
				t.Errorf("unexpected failures: %s", got)
			}
		})
	}
}

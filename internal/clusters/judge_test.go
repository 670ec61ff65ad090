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
	// heldUntil, when set, is when a lock the cluster still held after
	// ready, granted by a write the clients no longer know of (a failover
	// to a replica that missed later grants), lapsed: until then the key
	// is not free although no worker holds it.
	heldUntil time.Time
	// servedUntil, when set, is when the key stopped being served after
	// the event: a key on a Redis master that stays up is served until
	// the cluster declares the dead master failed and refuses every slot
	// (cluster-require-full-coverage), seconds after the kill.
	servedUntil time.Time
}

// excused is the time after e during which the key cannot be had: from
// when it stopped being served until the cluster serves again, or a lock
// it still held lapses.
func (e event) excused() (from, to time.Time) {
	from, to = e.at, e.ready
	if e.servedUntil.After(from) {
		from = e.servedUntil
	}
	if e.heldUntil.After(to) {
		to = e.heldUntil
	}
	return from, to
}

// bound is the longest the lock may go without a grant after e: ttl (0 when
// no lease has to run out), or the time until the cluster served again if
// longer, plus a second.
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
	// freeWaiting is the longest time within the event's window that a
	// waiting worker's key was free, not counting the excused time.
	freeWaiting time.Duration
}

// freeBound is the judged bound on the time a waiting worker may see its key
// free once the cluster serves again.
const freeBound = time.Second

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
	// freeWaiting is the longest time any waiting worker saw the key free
	// (no worker holding it) once the cluster served again, and freeAt
	// describes it; judged against freeBound when judgeFree.
	freeWaiting time.Duration
	freeAt      string
	judgeFree   bool
	events      []eventVerdict
	failures    []string
	notes       []string
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

// judgeFreeWaiting adds to v the longest time a waiting worker saw its key
// free: a stretch in which no worker held the lock (from a grant to the
// return of the Do that got it, or to the lease's expiry when its release
// failed), within a worker's wait (from its call to its grant), less the
// time an event excuses (until the cluster served again). With judged, a stretch longer than freeBound fails the scenario.
func judgeFreeWaiting(v *verdict, sections []section, waits []wait, stop time.Time, judged bool) {
	v.judgeFree = judged
	type span struct{ from, to time.Time }
	held := make([]span, 0, len(sections))
	for _, s := range sections {
		to := s.released
		if to.IsZero() {
			to = stop
		}
		if s.leaseUntil.After(to) {
			// Its release failed: the server kept the key until the
			// lease ran out, and no waiter could have it before.
			to = s.leaseUntil
		}
		held = append(held, span{s.granted, to})
	}
	slices.SortFunc(held, func(a, b span) int { return a.from.Compare(b.from) })
	// The free stretches: the gaps between the merged holdings, and the
	// time after the last one.
	var free []span
	var end time.Time
	for i, h := range held {
		if i > 0 && h.from.After(end) {
			free = append(free, span{end, h.from})
		}
		if h.to.After(end) {
			end = h.to
		}
	}
	if len(held) > 0 && stop.After(end) {
		free = append(free, span{end, stop})
	}
	var excused []span
	for _, e := range v.events {
		if from, to := e.excused(); to.After(from) {
			excused = append(excused, span{from, to})
		}
	}
	// counted cuts the excused time out of [from, to] and returns the
	// longest piece left.
	counted := func(from, to time.Time) (longest time.Duration, at time.Time) {
		pieces := []span{{from, to}}
		for _, x := range excused {
			var next []span
			for _, p := range pieces {
				if !x.from.Before(p.to) || !x.to.After(p.from) {
					next = append(next, p)
					continue
				}
				if x.from.After(p.from) {
					next = append(next, span{p.from, x.from})
				}
				if x.to.Before(p.to) {
					next = append(next, span{x.to, p.to})
				}
			}
			pieces = next
		}
		for _, p := range pieces {
			if d := p.to.Sub(p.from); d > longest {
				longest, at = d, p.from
			}
		}
		return longest, at
	}
	for _, w := range waits {
		to := w.to
		if to.After(stop) {
			to = stop
		}
		// The first free stretch that ends after the wait began.
		i, _ := slices.BinarySearchFunc(free, w.from, func(f span, t time.Time) int {
			if f.to.After(t) {
				return 1
			}
			return -1
		})
		for ; i < len(free) && free[i].from.Before(to); i++ {
			from, until := free[i].from, free[i].to
			if w.from.After(from) {
				from = w.from
			}
			if to.Before(until) {
				until = to
			}
			d, at := counted(from, until)
			if d <= 0 {
				continue
			}
			for j := range v.events {
				e := &v.events[j]
				if !at.Before(e.at) && (j+1 == len(v.events) || at.Before(v.events[j+1].at)) {
					e.freeWaiting = max(e.freeWaiting, d)
				}
			}
			if d > v.freeWaiting {
				v.freeWaiting = d
				v.freeAt = fmt.Sprintf("worker %d waited from %s and saw the key free from %s for %v", w.worker,
					w.from.Format("15:04:05.000"), at.Format("15:04:05.000"), d.Round(time.Millisecond))
			}
		}
	}
	if judged && v.freeWaiting > freeBound {
		v.failures = append(v.failures, fmt.Sprintf("a waiting worker saw its key free for %v, more than %v, after the cluster served again: %s",
			v.freeWaiting.Round(time.Millisecond), freeBound, v.freeAt))
	}
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

// TestJudgeFreeWaiting feeds judgeFreeWaiting histories with and without a
// waiter left on a free key, so that a clean row means the rule was
// checked.
func TestJudgeFreeWaiting(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	held := func(from, to int) section { return section{granted: at(from), ended: at(to - 1), released: at(to)} }
	cases := []struct {
		name     string
		sections []section
		waits    []wait
		events   []event
		want     time.Duration
		fails    bool
	}{
		{
			name:     "handoffs within milliseconds",
			sections: []section{held(0, 100), held(101, 200), held(203, 300)},
			waits:    []wait{{worker: 1, from: at(10), to: at(101)}, {worker: 2, from: at(20), to: at(203)}},
			want:     3 * time.Millisecond,
		},
		{
			name:     "a waiter left on a free key",
			sections: []section{held(0, 100), held(1600, 1700)},
			waits:    []wait{{worker: 1, from: at(10), to: at(1600)}},
			want:     1500 * time.Millisecond,
			fails:    true,
		},
		{
			name:     "free but nobody waiting",
			sections: []section{held(0, 100), held(1600, 1700)},
			waits:    []wait{{worker: 1, from: at(1500), to: at(1600)}},
			want:     100 * time.Millisecond,
		},
		{
			name:     "free while the cluster did not serve",
			sections: []section{held(0, 100), held(3200, 3300)},
			waits:    []wait{{worker: 1, from: at(10), to: at(3200)}},
			events:   []event{{name: "kill", at: at(150), ready: at(2500)}},
			want:     700 * time.Millisecond,
		},
		{
			name:     "free too long after the cluster served again",
			sections: []section{held(0, 100), held(4000, 4100)},
			waits:    []wait{{worker: 1, from: at(10), to: at(4000)}},
			events:   []event{{name: "kill", at: at(150), ready: at(2500)}},
			want:     1500 * time.Millisecond,
			fails:    true,
		},
		{
			name:     "free while the cluster still served the key",
			sections: []section{held(0, 100), held(2700, 2800)},
			waits:    []wait{{worker: 1, from: at(10), to: at(2700)}},
			events:   []event{{name: "kill", at: at(150), ready: at(2500), servedUntil: at(1400)}},
			want:     1300 * time.Millisecond,
			fails:    true,
		},
		{
			// The CLUSTERDOWN case: a master that stays up refuses the
			// release while the cluster is down, and the lease stays on
			// it until its TTL runs out, past the time the cluster serves
			// again; a waiter cannot have it before, and takes it then.
			name: "a lease left by a failed release",
			sections: []section{
				{granted: at(0), ended: at(20), released: at(400), leaseUntil: at(2000)},
				held(2001, 2100),
			},
			waits:  []wait{{worker: 1, from: at(10), to: at(2001)}},
			events: []event{{name: "kill", at: at(-2000), ready: at(800), servedUntil: at(15)}},
			want:   time.Millisecond,
		},
		{
			// The same lease, but the waiter comes long after it lapsed.
			name: "free too long after a failed release's lease lapsed",
			sections: []section{
				{granted: at(0), ended: at(20), released: at(400), leaseUntil: at(2000)},
				held(3500, 3600),
			},
			waits:  []wait{{worker: 1, from: at(10), to: at(3500)}},
			events: []event{{name: "kill", at: at(-2000), ready: at(800), servedUntil: at(15)}},
			want:   1500 * time.Millisecond,
			fails:  true,
		},
		{
			name:     "a lock the new master still held",
			sections: []section{held(0, 100), held(4000, 4100)},
			waits:    []wait{{worker: 1, from: at(10), to: at(4000)}},
			events:   []event{{name: "kill", at: at(150), ready: at(2500), heldUntil: at(3500)}},
			want:     500 * time.Millisecond,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := verdict{}
			for _, e := range append([]event{{name: "start", at: at(0)}}, c.events...) {
				v.events = append(v.events, eventVerdict{event: e})
			}
			judgeFreeWaiting(&v, c.sections, c.waits, at(5000), true)
			if v.freeWaiting != c.want {
				t.Errorf("longest free while waiting %v, want %v (%s)", v.freeWaiting, c.want, v.freeAt)
			}
			if failed := len(v.failures) > 0; failed != c.fails {
				t.Errorf("failures %q, want failing %v", v.failures, c.fails)
			}
		})
	}
}

package scheduler

import (
	"fmt"
	"math"
	"math/big"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/robfig/cron/v3"
)

// slotSchedule is the cron.Schedule robfig/cron runs a job on. It computes
// the job's slots on the scheduler's clock, aligns @every schedules to the
// anchor, and remembers each slot it hands out so that the run it fires can
// name it.
//
// robfig/cron's timer runs on the real clock. When the scheduler's clock is
// offset from it (WithClock), Next translates: it finds the next slot on the
// scheduler's clock and returns the real instant at which that clock shows
// it. A node whose clock is ahead thus fires earlier in real time, exactly
// as a skewed machine would, and still names the same slot as the others.
type slotSchedule struct {
	spec   cron.Schedule // nil for @every
	every  time.Duration
	anchor time.Time
	clock  func() time.Time

	mu sync.Mutex
	// pending holds the slots Next returned that have not fired yet, oldest
	// first. robfig/cron fires an entry for the value Next last returned and
	// only then asks for the following one, so each firing takes the oldest.
	// Pairing by order, not by comparing times, keeps a run that starts late
	// on a busy machine from taking its successor's name.
	pending []time.Time
	// handed is the last slot Next returned. passedOver, when set, is told
	// of the slots between it and the next one that no firing was ever
	// given: robfig/cron asks for the slot after the moment it fired, so
	// a firing an interval late (a stalled process, a suspended machine, a
	// clock stepped forward) leaves out the slots in between, and nothing
	// would record them.
	handed     time.Time
	passedOver func(first, last time.Time, n int)
}

// minEvery is the shortest @every interval: shorter ones would fire faster
// than a lock round trip and a slot claim can complete.
const minEvery = 100 * time.Millisecond

// parseSpec parses a cron spec. "@every D" is parsed here rather than by
// robfig/cron, which rounds D down to whole seconds (1500ms would run every
// second) and turns anything under a second into one: warden honours D to
// the nanosecond, or refuses it. It is recognised behind a CRON_TZ= or TZ=
// prefix too (the zone is checked, and means nothing to an interval), and
// with any spaces around it, so that no spelling of it reaches robfig/cron.
func parseSpec(p cron.Parser, spec string) (cron.Schedule, error) {
	body := strings.TrimSpace(spec)
	if strings.HasPrefix(body, "TZ=") || strings.HasPrefix(body, "CRON_TZ=") {
		i := strings.IndexFunc(body, unicode.IsSpace)
		if i < 0 {
			return nil, fmt.Errorf("spec %q: a time zone and no schedule", spec)
		}
		zone, rest := body[:i], body[i+1:]
		_, name, _ := strings.Cut(zone, "=")
		if _, err := time.LoadLocation(name); err != nil {
			return nil, fmt.Errorf("spec %q: %w", spec, err)
		}
		body = strings.TrimSpace(rest)
		if !strings.HasPrefix(body, "@every") {
			// robfig/cron reads the zone itself, and needs a single space
			// after it.
			sched, err := p.Parse(zone + " " + body)
			if err != nil {
				return nil, fmt.Errorf("spec %q: %w", spec, err)
			}
			return keepCronsRule(sched, body), nil
		}
	}
	if f := strings.Fields(body); len(f) > 0 && f[0] == "@every" {
		if len(f) != 2 {
			return nil, fmt.Errorf("spec %q: @every takes one duration", spec)
		}
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return nil, fmt.Errorf("spec %q: %w", spec, err)
		}
		if d < minEvery {
			return nil, fmt.Errorf("spec %q: interval %v is shorter than the minimum %v", spec, d, minEvery)
		}
		return cron.ConstantDelaySchedule{Delay: d}, nil
	}
	sched, err := p.Parse(body)
	if err != nil {
		return nil, fmt.Errorf("spec %q: %w", spec, err)
	}
	return keepCronsRule(sched, body), nil
}

// keepCronsRule returns sched as a wallClock when body, a spec without its
// zone, names fixed times of day: no '*' (or '?') leading its seconds,
// minute or hour field, or a descriptor other than @hourly. Specs with a
// wildcard there follow the clock, as cron's do, and keep robfig/cron's
// slots, and so their slot keys, exactly.
func keepCronsRule(sched cron.Schedule, body string) cron.Schedule {
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return sched
	}
	if strings.HasPrefix(body, "@") {
		if body == "@hourly" {
			return sched
		}
		return wallClock{spec}
	}
	f := strings.Fields(body)
	if len(f) == 5 {
		f = append([]string{"0"}, f...)
	}
	for _, field := range f[:3] {
		if strings.HasPrefix(field, "*") || strings.HasPrefix(field, "?") {
			return sched
		}
	}
	return wallClock{spec}
}

// wallClock is a cron schedule of fixed times of day that keeps cron's
// rule (cronie's, Vixie cron's) across daylight saving changes: a time
// the clocks skip runs at the change, and a time they repeat runs once, at
// its first occurrence. robfig/cron runs the first never and the second
// twice, each at a different instant, so that every replica would run a
// daily job twice on the day the clocks go back, a slot key for each.
//
// The slots every replica agrees on are instants: a repeated time keeps its
// first instant, the one robfig/cron gives first, and a skipped time gets
// the instant of the change (03:00 EDT for 02:30 in New York), which other
// slots of the job at that instant share. Days without a change keep
// robfig/cron's slots, and their keys, as they are.
type wallClock struct{ spec *cron.SpecSchedule }

// Next implements cron.Schedule.
func (w wallClock) Next(t time.Time) time.Time {
	loc := w.spec.Location
	if loc == time.Local {
		loc = t.Location() // robfig/cron's reading of a spec with no zone
	}
	for {
		next := w.spec.Next(t)
		if next.IsZero() {
			return next
		}
		if change := w.skipped(t.In(loc), next); !change.IsZero() {
			return change.In(next.Location())
		}
		if !repeated(next.In(loc)) {
			return next
		}
		t = next
	}
}

// skipped returns the first change of the clocks after t and not after
// next that skips a time the spec names, or zero when none does.
func (w wallClock) skipped(t, next time.Time) time.Time {
	for {
		_, change := t.ZoneBounds()
		if change.IsZero() || change.After(next) {
			return time.Time{}
		}
		if !change.After(t) {
			// Past the zone's table of changes, where its rule goes on,
			// Go ends a zone at a year's end that it then reports
			// again as the end: step over it.
			t = t.Add(time.Second)
			continue
		}
		_, before := change.Add(-time.Nanosecond).Zone()
		_, after := change.Zone()
		if gap := time.Duration(after-before) * time.Second; gap > 0 {
			// The skipped times are those the clocks would have shown for
			// gap from the change on, had they not moved: the spec read in
			// a zone fixed at the old offset finds them.
			old := time.FixedZone("", before)
			from := change.In(old)
			spec := *w.spec
			spec.Location = old
			if n := spec.Next(from.Add(-time.Second)); !n.IsZero() && n.Before(from.Add(gap)) {
				return change
			}
		}
		t = change
	}
}

// repeated reports whether the wall time t shows came earlier too: t is
// within the stretch after a change that set the clocks back.
func repeated(t time.Time) bool {
	start, _ := t.ZoneBounds()
	if start.IsZero() {
		return false
	}
	_, before := start.Add(-time.Nanosecond).Zone()
	_, now := t.Zone()
	back := time.Duration(before-now) * time.Second
	return back > 0 && t.Before(start.Add(back))
}

// shortestInterval is the shortest gap between the next few slots of s,
// which is what a default LockAtLeastFor must stay under.
func shortestInterval(s cron.Schedule) time.Duration {
	if cd, ok := s.(cron.ConstantDelaySchedule); ok {
		return cd.Delay
	}
	var shortest time.Duration
	t := s.Next(time.Now())
	for range 32 {
		next := s.Next(t)
		if next.IsZero() {
			break
		}
		if gap := next.Sub(t); shortest == 0 || gap < shortest {
			shortest = gap
		}
		t = next
	}
	return shortest
}

func newSlotSchedule(s cron.Schedule, anchor time.Time, clock func() time.Time) *slotSchedule {
	ss := &slotSchedule{spec: s, anchor: anchor, clock: clock}
	if cd, ok := s.(cron.ConstantDelaySchedule); ok {
		ss.spec, ss.every = nil, cd.Delay
		ss.anchor = nearEpoch(anchor, cd.Delay)
	}
	return ss
}

// nearEpoch returns the one instant anchor + k*every, for an integer k,
// in the interval after the Unix epoch: the same slots, from an anchor
// that after can measure from. time.Time.Sub saturates at about 292 years,
// so that an anchor centuries away (the zero time.Time of an unset field,
// a far future date) named slots centuries in the past, which the timer
// fired at once and again, or in the future, which it never reached.
func nearEpoch(anchor time.Time, every time.Duration) time.Time {
	ns := new(big.Int).Mul(big.NewInt(anchor.Unix()), big.NewInt(int64(time.Second)))
	ns.Add(ns, big.NewInt(int64(anchor.Nanosecond())))
	return time.Unix(0, ns.Mod(ns, big.NewInt(int64(every))).Int64())
}

// next returns the slot that fires next, or zero when the spec never fires
// again. Between a firing, which takes its slot, and robfig/cron's asking
// Next for the following one, nothing is pending: the slot after now on the
// scheduler's clock is the one cron is about to be given.
func (s *slotSchedule) next() time.Time {
	s.mu.Lock()
	if len(s.pending) > 0 {
		defer s.mu.Unlock()
		return s.pending[0]
	}
	s.mu.Unlock()
	return s.after(s.clock())
}

// Next implements cron.Schedule.
func (s *slotSchedule) Next(t time.Time) time.Time {
	wall := time.Now()
	offset := s.clock().Sub(wall)
	s.mu.Lock()
	slot := s.after(t.Add(offset))
	// A clock stepped back since the last slot was handed out would name
	// that slot, or an earlier one, again, and the node would run it a
	// second time. robfig/cron on a machine whose clock is stepped back
	// does not: it asks for the slot after the instant it fired, read
	// before the step. Slots are handed out in order, each once.
	if !s.handed.IsZero() && !slot.IsZero() && !slot.After(s.handed) {
		slot = s.after(s.handed)
	}
	if slot.IsZero() {
		s.mu.Unlock()
		return slot // the spec never fires again
	}
	// The queue stays short: a Scheduler starts its cron once, so every
	// value handed out is fired, in order, except the last one at Stop.
	s.pending = append(s.pending, slot)
	var first, last time.Time
	n := 0
	if !s.handed.IsZero() {
		for v := s.after(s.handed); !v.IsZero() && v.Before(slot) && n < maxPassedOver; v = s.after(v) {
			if n == 0 {
				first = v
			}
			last, n = v, n+1
		}
	}
	s.handed = slot
	passedOver := s.passedOver
	s.mu.Unlock()
	if n > 0 && passedOver != nil {
		passedOver(first, last, n)
	}
	return slot.Add(-offset)
}

// maxPassedOver bounds the count of slots a late firing left out: after a
// long suspension a per-second job would otherwise count for as long.
const maxPassedOver = 100_000

// after returns the first slot strictly after v, on the scheduler's clock.
func (s *slotSchedule) after(v time.Time) time.Time {
	if s.spec != nil {
		return s.spec.Next(v)
	}
	d := v.Sub(s.anchor)
	k := d / s.every
	if d < 0 && d%s.every != 0 {
		k-- // floor, for instants before the anchor
	}
	return s.anchor.Add((k + 1) * s.every).In(v.Location())
}

// atOrBefore returns the latest slot at or before now, which a firing
// less than interval (the shortest between two slots) late finds as its
// own. A spec's slots are looked for from an interval before now, and from
// twice as far back each time none is found there.
func (s *slotSchedule) atOrBefore(now time.Time, interval time.Duration) time.Time {
	if s.spec == nil {
		return s.after(now.Add(-s.every))
	}
	for back := max(interval, time.Second); back < math.MaxInt64/2; back *= 2 {
		if v := s.spec.Next(now.Add(-back)); !v.IsZero() && !v.After(now) {
			for next := s.spec.Next(v); !next.IsZero() && !next.After(now); next = s.spec.Next(next) {
				v = next
			}
			return v
		}
	}
	// No slot in the last 146 years: none a firing can be for.
	return now.Truncate(time.Second)
}

// fired returns the slot of the firing that is starting now.
func (s *slotSchedule) fired() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return time.Time{}, false
	}
	slot := s.pending[0]
	s.pending = s.pending[1:]
	return slot, true
}

package scheduler

import (
	"fmt"
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
			body = zone + " " + body
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
	return sched, nil
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
	}
	return ss
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
	slot := s.after(t.Add(offset))
	if slot.IsZero() {
		return slot // the spec never fires again
	}
	s.mu.Lock()
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

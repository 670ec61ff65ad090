package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

func TestEverySlotsAreAlignedToTheAnchor(t *testing.T) {
	anchor := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newSlotSchedule(cron.Every(10*time.Second), anchor, time.Now)
	for _, c := range []struct{ v, want time.Time }{
		{anchor.Add(3 * time.Second), anchor.Add(10 * time.Second)},
		{anchor.Add(10 * time.Second), anchor.Add(20 * time.Second)}, // strictly after
		{anchor.Add(-3 * time.Second), anchor},
		{anchor.Add(-10 * time.Second), anchor},
	} {
		if got := s.after(c.v); !got.Equal(c.want) {
			t.Errorf("after(%v) = %v, want %v", c.v, got, c.want)
		}
	}
}

func TestNextTranslatesAnOffsetClock(t *testing.T) {
	const offset = 400 * time.Millisecond
	s := newSlotSchedule(cron.Every(time.Second), time.Unix(0, 0), func() time.Time { return time.Now().Add(offset) })
	now := time.Now()
	next := s.Next(now)
	slot, ok := s.fired()
	if !ok {
		t.Fatal("no slot recorded")
	}
	if slot.Truncate(time.Second) != slot {
		t.Errorf("slot %v not on a whole second", slot)
	}
	// The timer fires when the skewed clock shows the slot: offset earlier
	// in real time (give or take the two clock reads).
	if d := slot.Sub(next) - offset; d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("Next = %v for slot %v: %v off the clock's offset", next, slot, d)
	}
	if _, ok := s.fired(); ok {
		t.Error("a slot fired twice")
	}
}

func TestSpecSlotIsTheSpecTime(t *testing.T) {
	spec, err := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("*/5 * * * * *")
	if err != nil {
		t.Fatal(err)
	}
	s := newSlotSchedule(spec, time.Unix(0, 0), time.Now)
	v := time.Date(2030, 1, 1, 0, 0, 7, 0, time.UTC)
	if got, want := s.after(v), time.Date(2030, 1, 1, 0, 0, 10, 0, time.UTC); !got.Equal(want) {
		t.Errorf("after(%v) = %v, want %v", v, got, want)
	}
}

// TestNextWhileFiring: between a firing and cron's asking for the following
// slot nothing is pending, and next still names the coming slot rather than
// zero, which Entries documents as "not running".
func TestNextWhileFiring(t *testing.T) {
	anchor := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := anchor.Add(1500 * time.Millisecond)
	s := newSlotSchedule(cron.Every(time.Second), anchor, func() time.Time { return now })
	s.Next(now)
	if _, ok := s.fired(); !ok {
		t.Fatal("no slot recorded")
	}
	if got, want := s.next(), anchor.Add(2*time.Second); !got.Equal(want) {
		t.Fatalf("next() with nothing pending = %v, want the slot after the clock, %v", got, want)
	}
}

// TestNextReportsSlotsPassedOver: a firing late by more than an interval
// asks Next for the slot after the moment it fired, and the slots in
// between, never handed out, are reported once, as a stretch; a firing on
// time reports nothing.
func TestNextReportsSlotsPassedOver(t *testing.T) {
	anchor := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return anchor.Add(d) }
	type stretch struct {
		first, last time.Time
		n           int
	}
	var got []stretch
	s := newSlotSchedule(cron.Every(time.Second), anchor, time.Now)
	s.passedOver = func(first, last time.Time, n int) { got = append(got, stretch{first, last, n}) }
	for _, c := range []struct {
		firedAt time.Duration
		want    time.Duration // the slot handed out
	}{
		{500 * time.Millisecond, time.Second},
		{1100 * time.Millisecond, 2 * time.Second},
		{4300 * time.Millisecond, 5 * time.Second}, // 3s and 4s passed over
		{5200 * time.Millisecond, 6 * time.Second},
		{7100 * time.Millisecond, 8 * time.Second}, // 7s passed over
	} {
		s.Next(at(c.firedAt))
		if slot, _ := s.fired(); !slot.Equal(at(c.want)) {
			t.Fatalf("fired at %v: slot %v, want %v", c.firedAt, slot.Sub(anchor), c.want)
		}
	}
	want := []stretch{{at(3 * time.Second), at(4 * time.Second), 2}, {at(7 * time.Second), at(7 * time.Second), 1}}
	if len(got) != len(want) {
		t.Fatalf("stretches passed over: %v, want %v", got, want)
	}
	for i := range want {
		if !got[i].first.Equal(want[i].first) || !got[i].last.Equal(want[i].last) || got[i].n != want[i].n {
			t.Errorf("stretch %d: %v, want %v", i, got[i], want[i])
		}
	}
}

// "@every D" keeps D to the nanosecond however it is written: behind a time
// zone prefix, or with other spaces around it. robfig/cron, which would
// otherwise parse those spellings, rounds D to whole seconds.
func TestEveryIsParsedHereInEverySpelling(t *testing.T) {
	p := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	for _, c := range []struct {
		spec string
		want time.Duration
	}{
		{"@every 1500ms", 1500 * time.Millisecond},
		{"CRON_TZ=UTC @every 1500ms", 1500 * time.Millisecond},
		{"TZ=America/New_York @every 2500ms", 2500 * time.Millisecond},
		{"TZ=UTC @every 100ms", 100 * time.Millisecond},
		{"@every\t1s", time.Second},
		{" @every 1s", time.Second},
		{"@every 1s\n", time.Second},
	} {
		s, err := parseSpec(p, c.spec)
		if err != nil {
			t.Errorf("%q: %v", c.spec, err)
			continue
		}
		if got := shortestInterval(s); got != c.want {
			t.Errorf("%q: interval %v, want %v", c.spec, got, c.want)
		}
	}
	// A zone in front of a cron spec still reaches robfig/cron.
	s, err := parseSpec(p, "CRON_TZ=Asia/Tokyo 0 9 * * *")
	if err != nil {
		t.Fatal(err)
	}
	if loc := s.(wallClock).spec.Location; loc.String() != "Asia/Tokyo" {
		t.Errorf("CRON_TZ=Asia/Tokyo: location %v", loc)
	}
}

// Across daylight saving changes a job at fixed times of day keeps cron's
// rule (cronie's, Vixie cron's): a time the clocks skip runs at the change,
// a repeated time runs once, at its first instant; a job with a wildcard
// in its seconds, minute or hour field follows the clock. Slots are listed
// as UTC instants, which is what names them in the slot store.
func TestDSTSlotsKeepCronsRule(t *testing.T) {
	p := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	for _, c := range []struct {
		zone, spec, day string
		want            []string
	}{
		// New York: 02:00 EST -> 03:00 EDT on 8 March, 02:00 EDT -> 01:00 EST on 1 November.
		{"America/New_York", "30 2 * * *", "2026-03-08", []string{"07:00"}},
		{"America/New_York", "30 1 * * *", "2026-11-01", []string{"05:30"}},
		{"America/New_York", "0 30 1 * * *", "2026-11-01", []string{"05:30"}},
		{"America/New_York", "0,30 2,3 * * *", "2026-03-08", []string{"07:00", "07:30"}},
		{"America/New_York", "*/30 1 * * *", "2026-11-01", []string{"05:00", "05:30", "06:00", "06:30"}},
		{"America/New_York", "@daily", "2026-11-01", []string{"04:00"}},
		// London: 01:00 GMT -> 02:00 BST on 29 March, 02:00 BST -> 01:00 GMT on 25 October.
		{"Europe/London", "30 1 * * *", "2026-03-29", []string{"01:00"}},
		{"Europe/London", "30 1 * * *", "2026-10-25", []string{"00:30"}},
		{"Europe/London", "15 1 * * 0", "2026-10-25", []string{"00:15"}},
		{"Europe/London", "0 * * * *", "2026-03-29", hours(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22)},
		{"Europe/London", "0 * * * *", "2026-10-25", hours(-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23)},
	} {
		loc, err := time.LoadLocation(c.zone)
		if err != nil {
			t.Fatal(err)
		}
		day, err := time.ParseInLocation(time.DateOnly, c.day, loc)
		if err != nil {
			t.Fatal(err)
		}
		sched, err := parseSpec(p, "CRON_TZ="+c.zone+" "+c.spec)
		if err != nil {
			t.Fatal(err)
		}
		s := newSlotSchedule(sched, time.Unix(0, 0), time.Now)
		var got []string
		end := day.AddDate(0, 0, 1)
		for v := s.after(day.Add(-time.Nanosecond)); !v.IsZero() && v.Before(end); v = s.after(v) {
			got = append(got, v.UTC().Format("15:04"))
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %q on %s: slots at %v UTC, want %v", c.zone, c.spec, c.day, got, c.want)
		}
	}
}

// hours lists the whole hours from the given offsets to midnight UTC (-1:
// 23:00 the day before), as TestDSTSlotsKeepCronsRule lists slots.
func hours(hs ...int) []string {
	var out []string
	for _, h := range hs {
		out = append(out, time.Date(2026, 1, 1, h, 0, 0, 0, time.UTC).Format("15:04"))
	}
	return out
}

// Every slot of a job at fixed times is robfig/cron's instant, and so has
// the key it had, when the clocks do not change since the slot before it:
// a rolling upgrade re-runs no slot. 400 slots of each reach 2059, past the
// end of the zones' tables of changes, where Go applies their rules.
func TestDSTRuleKeepsOtherDaysSlots(t *testing.T) {
	p := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	for _, zone := range []string{"America/New_York", "Europe/London", "UTC"} {
		for _, spec := range []string{"30 1 * * *", "0 3 * * 1-5", "@daily", "5 4 1 * *"} {
			full := "CRON_TZ=" + zone + " " + spec
			ours, err := parseSpec(p, full)
			if err != nil {
				t.Fatal(err)
			}
			theirs, err := p.Parse(full)
			if err != nil {
				t.Fatal(err)
			}
			loc := theirs.(*cron.SpecSchedule).Location
			for v, n := time.Date(2026, 1, 1, 0, 0, 0, 0, loc), 0; n < 400; n++ {
				want, got := theirs.Next(v), ours.Next(v)
				// No change of the clocks between v and want: at most one
				// happens between two slots of these specs.
				_, o1 := v.Zone()
				_, o2 := want.Zone()
				if o1 == o2 && !got.Equal(want) {
					t.Errorf("%s after %v: %v, robfig/cron's %v", full, v, got, want)
				}
				v = want
			}
		}
	}
}

// TestEverySlotsFromAFarAnchor: an anchor centuries away (a zero time.Time
// from an unset field, a far future date) still names the slot after v,
// one of anchor + k*D. Time.Sub saturates at about 292 years, and slots
// computed from it landed centuries in the past, which the timer fired at
// once, over and over.
func TestEverySlotsFromAFarAnchor(t *testing.T) {
	v := time.Date(2030, 6, 1, 12, 0, 0, 123, time.UTC)
	for _, anchor := range []time.Time{
		{},
		time.Date(1600, 3, 1, 0, 0, 0, 7, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
	} {
		for _, every := range []time.Duration{time.Second, 7 * time.Second, 90 * time.Minute, 1500 * time.Millisecond} {
			// The same slots, from an anchor moved near v by whole
			// intervals.
			near := anchor
			chunk := (100 * 365 * 24 * time.Hour / every) * every
			for near.Before(v.Add(-chunk)) {
				near = near.Add(chunk)
			}
			for near.After(v.Add(chunk)) {
				near = near.Add(-chunk)
			}
			want := newSlotSchedule(cron.ConstantDelaySchedule{Delay: every}, near, time.Now).after(v)
			got := newSlotSchedule(cron.ConstantDelaySchedule{Delay: every}, anchor, time.Now).after(v)
			if !got.Equal(want) || !got.After(v) || got.After(v.Add(every)) {
				t.Errorf("anchor %v, every %v: after(%v) = %v, want %v", anchor, every, v, got, want)
			}
		}
	}
}

package scheduler

import (
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
	if loc := s.(*cron.SpecSchedule).Location; loc.String() != "Asia/Tokyo" {
		t.Errorf("CRON_TZ=Asia/Tokyo: location %v", loc)
	}
}

package sqllock

import (
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// sent records the announcements an announcer sends.
type sent struct {
	mu    sync.Mutex
	names []string
}

func (s *sent) send(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names = append(s.names, name)
}

func (s *sent) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := s.names
	s.names = nil
	return names
}

func newAnnouncer(s *sent) *announcer {
	return &announcer{delay: time.Millisecond, send: s.send}
}

// TestAnnouncerDelays: a release is announced once its delay has passed and
// not before, each name at its own time, with one timer re-armed for all.
func TestAnnouncerDelays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s sent
		a := newAnnouncer(&s)
		a.after("a")
		time.Sleep(time.Millisecond / 2)
		a.after("b")
		synctest.Wait()
		if got := s.take(); len(got) != 0 {
			t.Fatalf("announced %q before the delay", got)
		}
		time.Sleep(time.Millisecond / 2)
		synctest.Wait()
		if got := s.take(); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("after a's delay: announced %q, want [a]", got)
		}
		time.Sleep(time.Millisecond / 2)
		synctest.Wait()
		if got := s.take(); !slices.Equal(got, []string{"b"}) {
			t.Fatalf("after b's delay: announced %q, want [b]", got)
		}
		a.after("a")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := s.take(); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("a second release: announced %q, want [a]", got)
		}
		a.flush()
	})
}

// TestAnnouncerTakenBack: an attempt that finds the lock taken, begun after
// the release, drops its announcement and stops the timer; one begun before
// the release, or one that got no answer, does not.
func TestAnnouncerTakenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s sent
		a := newAnnouncer(&s)
		a.after("k")
		a.end("k", a.begin("k"), true)
		a.mu.Lock()
		armed := a.armed
		a.mu.Unlock()
		if armed {
			t.Error("the timer is still set with nothing to announce")
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if got := s.take(); len(got) != 0 {
			t.Fatalf("announced %q, taken back", got)
		}

		early := a.begin("k")
		a.after("k")
		a.end("k", early, true)
		a.after("j")
		a.end("j", a.begin("j"), false)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		got := s.take()
		slices.Sort(got)
		if !slices.Equal(got, []string{"j", "k"}) {
			t.Fatalf("announced %q, want [j k]", got)
		}
	})
}

// TestAnnouncerWaitsForAttempt: an announcement due while an attempt on its
// name is under way waits for that attempt's answer, up to maxPostpone
// delays.
func TestAnnouncerWaitsForAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s sent
		a := newAnnouncer(&s)
		a.after("k")
		mark := a.begin("k")
		time.Sleep(5 * time.Millisecond)
		synctest.Wait()
		if got := s.take(); len(got) != 0 {
			t.Fatalf("announced %q during an attempt", got)
		}
		a.end("k", mark, false)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := s.take(); !slices.Equal(got, []string{"k"}) {
			t.Fatalf("after a failed attempt: announced %q, want [k]", got)
		}

		a.after("k")
		mark = a.begin("k")
		time.Sleep((maxPostpone + 1) * time.Millisecond)
		synctest.Wait()
		if got := s.take(); !slices.Equal(got, []string{"k"}) {
			t.Fatalf("after %d delays: announced %q, want [k]", maxPostpone+1, got)
		}
		a.end("k", mark, true)
	})
}

// TestAnnouncerFlush: flush sends what is pending at once, and nothing is
// sent twice.
func TestAnnouncerFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s sent
		a := newAnnouncer(&s)
		a.after("a")
		a.after("b")
		a.flush()
		got := s.take()
		slices.Sort(got)
		if !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("flush announced %q, want [a b]", got)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if got := s.take(); len(got) != 0 {
			t.Fatalf("announced %q again after flush", got)
		}
	})
}

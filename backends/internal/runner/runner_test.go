package runner

import (
	"testing"
	"testing/synctest"
)

// job is a Job that returns when release is closed, and counts its
// abandonments.
type job struct {
	release chan struct{}
	ran     bool
	left    int
}

func (j *job) Run()       { <-j.release; j.ran = true }
func (j *job) Abandoned() { j.left++ }

func quick() *job {
	j := &job{release: make(chan struct{})}
	close(j.release)
	return j
}

// TestReused: a runner put back serves the next caller, keeping its Local.
func TestReused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var p Pool[int]
		r := p.Get()
		r.Local = 7
		j := quick()
		r.Start(j)
		<-r.Done()
		if !j.ran {
			t.Fatal("Done before Run returned")
		}
		p.Put(r)
		if r2 := p.Get(); r2 != r || r2.Local != 7 {
			t.Fatalf("Get after Put: the same runner %v, Local %d; want true, 7", r2 == r, r2.Local)
		}
		p.Put(r)
		p.Close()
		synctest.Wait() // the closed runner's goroutine ends, or the bubble reports it
	})
}

// TestAbandoned: a caller that stops waiting leaves the job to finish, its
// Abandoned called once after Run, and the runner back among the idle.
func TestAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var p Pool[struct{}]
		r := p.Get()
		j := &job{release: make(chan struct{})}
		r.Start(j)
		if !r.Abandon() {
			t.Fatal("Abandon of a job still running reported it answered")
		}
		if n := p.Idle(); n != 0 {
			t.Fatalf("%d idle while the abandoned job runs, want 0", n)
		}
		close(j.release)
		synctest.Wait()
		if !j.ran || j.left != 1 {
			t.Fatalf("abandoned job: ran %v, Abandoned %d times; want true, 1", j.ran, j.left)
		}
		if n := p.Idle(); n != 1 {
			t.Fatalf("%d idle after the abandoned job ended, want 1", n)
		}
		p.Close()
	})
}

// TestAnsweredBeforeAbandon: a job that returned before its caller gave up
// is the caller's: Abandon says so, and Abandoned is never called.
func TestAnsweredBeforeAbandon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var p Pool[struct{}]
		r := p.Get()
		j := quick()
		r.Start(j)
		synctest.Wait() // Run has returned and signalled Done
		if r.Abandon() {
			t.Fatal("Abandon of an answered job reported it abandoned")
		}
		<-r.Done()
		p.Put(r)
		if j.left != 0 {
			t.Errorf("answered job abandoned %d times", j.left)
		}
		p.Close()
	})
}

// TestMaxIdle: after a burst of concurrent calls, MaxIdle runners stay and
// the others end; Close ends those too.
func TestMaxIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var p Pool[struct{}]
		const burst = 3 * MaxIdle
		rs := make([]*Runner[struct{}], burst)
		for i := range rs {
			rs[i] = p.Get()
			rs[i].Start(quick())
		}
		for _, r := range rs {
			<-r.Done()
			p.Put(r)
		}
		if n := p.Idle(); n != MaxIdle {
			t.Errorf("%d idle after a burst of %d, want %d", n, burst, MaxIdle)
		}
		p.Close()
		if n := p.Idle(); n != 0 {
			t.Errorf("%d idle after Close, want 0", n)
		}
	})
}

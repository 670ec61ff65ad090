//go:build clusters

package clusters

import (
	"fmt"
	"sync"
	"time"
)

// section is one grant of the lock: one run of a worker's critical section.
type section struct {
	id      int
	worker  int
	token   uint64
	granted time.Time // when the section started, the lock just acquired
	ended   time.Time // when it returned; zero while it runs
	// released is when the Do that ran it returned, its lock given back
	// (or the release given up): until then nobody else may take the lock.
	released time.Time
	// leaseUntil, when set, is when the lease of a section whose release
	// failed ran out on the server (its last confirmed expiry): until then
	// the key stayed taken, though nobody held it, and no waiter could
	// have it.
	leaseUntil time.Time
	// seen is the store's version this section last read or wrote. An
	// accepted write finding another version means that another section
	// wrote in between: the two sections overlapped and the fence let both
	// through.
	seen     int
	accepted int
	refused  int
}

// fencedCounter is the storage the lock protects: a counter that refuses a
// write whose token is lower than the highest it accepted, as storage given
// fencing tokens does. It also keeps the history the judges read: every
// section, and every accepted write that followed another section's write
// since the writer's read (a lost update the fence did not stop).
type fencedCounter struct {
	mu       sync.Mutex
	value    int64
	fence    uint64
	version  int // accepted writes so far
	lastBy   *section
	accepted int
	refused  int
	sections []*section
	// overlapCount counts accepted writes that followed another section's
	// accepted write since the writer's read; overlaps describes the first.
	overlapCount int
	overlaps     []string
	// waits are the workers' waits for the lock, one per Do: from the
	// call to the grant, or to Do's return when it granted nothing.
	waits []wait
}

// wait is one worker's wait for the lock.
type wait struct {
	worker   int
	from, to time.Time
}

func (c *fencedCounter) begin(worker int, token uint64, now time.Time) *section {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &section{id: len(c.sections), worker: worker, token: token, granted: now}
	c.sections = append(c.sections, s)
	return s
}

func (c *fencedCounter) end(s *section, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.ended = now
}

// released records that the Do that ran s returned.
func (c *fencedCounter) released(s *section, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.released = now
}

// leaseLeft records that the release of s failed, leaving its lease on the
// server until until.
func (c *fencedCounter) leaseLeft(s *section, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.leaseUntil = until
}

// waited records that worker waited for the lock from from to to.
func (c *fencedCounter) waited(worker int, from, to time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waits = append(c.waits, wait{worker: worker, from: from, to: to})
}

// waitsSnapshot copies the waits.
func (c *fencedCounter) waitsSnapshot() []wait {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]wait(nil), c.waits...)
}

func (c *fencedCounter) read(s *section) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.seen = c.version
	return c.value
}

// write stores v for section s, unless s's token is below the fence.
func (c *fencedCounter) write(s *section, v int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.token < c.fence {
		c.refused++
		s.refused++
		return false
	}
	if c.version != s.seen {
		c.overlapCount++
		if len(c.overlaps) < 20 {
			other := c.lastBy
			c.overlaps = append(c.overlaps, fmt.Sprintf(
				"section %d (worker %d, token %d) wrote %d after section %d (worker %d, token %d) had written since its read",
				s.id, s.worker, s.token, v, other.id, other.worker, other.token))
		}
	}
	c.fence = s.token
	c.value = v
	c.version++
	c.lastBy = s
	s.seen = c.version
	c.accepted++
	s.accepted++
	return true
}

// snapshot copies the history, for judges that must not race the workers.
func (c *fencedCounter) snapshot() (sections []section, accepted, refused, overlapCount int, overlaps []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sections = make([]section, len(c.sections))
	for i, s := range c.sections {
		sections[i] = *s
	}
	return sections, c.accepted, c.refused, c.overlapCount, append([]string(nil), c.overlaps...)
}

// lastGrant is when the last section started (zero before the first).
func (c *fencedCounter) lastGrant() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.sections) == 0 {
		return time.Time{}
	}
	return c.sections[len(c.sections)-1].granted
}

// grantsSince counts the sections that started at or after t.
func (c *fencedCounter) grantsSince(t time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.sections {
		if !s.granted.Before(t) {
			n++
		}
	}
	return n
}

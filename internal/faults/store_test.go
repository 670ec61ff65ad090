//go:build faults

package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/fence"
)

// The fenced store: one counter, served over TCP by the test process to the
// workers, one JSON line per request and per answer. It lives outside every
// backend under test, so a server restart or a partition never touches it,
// and it sees every worker on one clock.

// request is what a worker sends: a read at the start of a section, a write
// of the counter with the section's token, or the report of how a section
// ended.
type request struct {
	Op      string    `json:"op"` // "read", "write", "end"
	Worker  int       `json:"worker"`
	Section int       `json:"section"` // per worker, from 1
	Token   uint64    `json:"token"`
	Entered time.Time `json:"entered"` // when the section started, by the worker's wall clock
	Value   int64     `json:"value,omitempty"`

	// Only in "end".
	DoErr     string    `json:"do_err,omitempty"`
	DoLost    bool      `json:"do_lost,omitempty"`    // Do's error wraps guard.ErrLockLost
	CauseLost bool      `json:"cause_lost,omitempty"` // the section context's cause wraps it
	LostAt    time.Time `json:"lost_at"`              // when the section saw its context end with ErrLockLost
}

// reply answers a read (Value, Hold) or a write (Accepted, Reason).
type reply struct {
	Value    int64         `json:"value"`
	Hold     time.Duration `json:"hold"` // how long the section lingers between its two writes
	Accepted bool          `json:"accepted"`
	Reason   string        `json:"reason,omitempty"`
}

// event is one request as the store recorded it.
type event struct {
	request
	Seq      int
	At       time.Time // when the store handled it
	Accepted bool
	Reason   string
}

// sectionID names a critical section across workers.
type sectionID struct{ Worker, Section int }

func (e *event) section() sectionID { return sectionID{e.Worker, e.Section} }

// store is the fenced counter. It refuses a write whose token is lower than
// the highest it has accepted, and one that carries that highest token from
// another section: two holders with one token are as bad as an old one. The
// first is warden's own fenced write (redislock.Fence, on the shared Redis,
// which no fault touches), so every fault row tests it too.
type store struct {
	ln          net.Listener
	defaultHold time.Duration
	redis       *goredis.Client
	fence       *redislock.Fence
	resource    string // this store's alone
	// unfenced makes the store accept every write: only for the judges'
	// own test, to show that they catch what a fence would have stopped.
	unfenced bool

	mu       sync.Mutex
	counter  int64
	maxToken uint64
	maxFrom  sectionID // the section that wrote maxToken
	anyYet   bool
	events   []event
	changed  chan struct{} // closed and replaced on every event
	holdNext time.Duration // for the next section to start, when > 0
	marked   []sectionID   // the sections that got holdNext, in order
	holdFor  map[int]time.Duration
	conns    map[net.Conn]bool
	closed   bool
}

func startStore(defaultHold time.Duration) (*store, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := os.Getenv("WARDEN_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:16379"
	}
	rc := goredis.NewClient(&goredis.Options{Addr: addr})
	f, err := redislock.NewFence(rc)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &store{ln: ln, defaultHold: defaultHold, changed: make(chan struct{}),
		holdFor: map[int]time.Duration{}, conns: map[net.Conn]bool{},
		redis: rc, fence: f, resource: fmt.Sprintf("{warden-faults/%d.%d}", os.Getpid(), time.Now().UnixNano())}
	go s.serve()
	return s, nil
}

func (s *store) addr() string { return s.ln.Addr().String() }

func (s *store) close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
	s.redis.Close()
}

func (s *store) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.mu.Unlock()
		go s.handle(c)
	}
}

func (s *store) handle(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	dec := json.NewDecoder(bufio.NewReader(c))
	enc := json.NewEncoder(c)
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			return
		}
		if err := enc.Encode(s.apply(req)); err != nil {
			return
		}
	}
}

func (s *store) apply(req request) reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := event{request: req, Seq: len(s.events), At: time.Now()}
	var r reply
	switch req.Op {
	case "read":
		r.Value = s.counter
		ev.Value = s.counter
		r.Hold = s.defaultHold
		if d, ok := s.holdFor[req.Worker]; ok {
			r.Hold = d
			delete(s.holdFor, req.Worker)
		} else if s.holdNext > 0 {
			r.Hold = s.holdNext
			s.holdNext = 0
			s.marked = append(s.marked, ev.section())
		}
	case "write":
		from := ev.section()
		switch {
		case s.unfenced:
		case s.anyYet && req.Token == s.maxToken && from != s.maxFrom:
			ev.Reason = fmt.Sprintf("token %d already written by worker %d section %d", req.Token, s.maxFrom.Worker, s.maxFrom.Section)
		default:
			ev.Reason = s.fencedWrite(req)
		}
		if ev.Reason == "" {
			ev.Accepted = true
			s.counter = req.Value
			s.maxToken, s.maxFrom, s.anyYet = req.Token, from, true
		}
		r.Accepted, r.Reason = ev.Accepted, ev.Reason
	}
	s.events = append(s.events, ev)
	close(s.changed)
	s.changed = make(chan struct{})
	return r
}

// fencedWrite writes the counter through the fence, and returns why it was
// refused, or "".
func (s *store) fencedWrite(req request) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.fence.Set(ctx, fence.Claim{Resource: s.resource, Token: req.Token}, s.resource+":counter", req.Value, 0)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, fence.ErrStaleToken):
		return fmt.Sprintf("token %d below %d", req.Token, fence.Highest(err))
	}
	return fmt.Sprintf("the fence failed: %v", err)
}

// markNext makes the next section to start, whoever runs it, linger d
// between its writes, so that a fault can be aimed at a holder that is
// surely inside its section. It returns how many sections were marked
// before, the index of the one it marks.
func (s *store) markNext(d time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdNext = d
	return len(s.marked)
}

// markWorker makes worker's next section linger d.
func (s *store) markWorker(worker int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdFor[worker] = d
}

// snapshot is a consistent view of the store for judges and waits.
type snapshot struct {
	counter int64
	events  []event
	marked  []sectionID
}

func (s *store) snap() snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return snapshot{counter: s.counter, events: s.events[:len(s.events):len(s.events)], marked: append([]sectionID(nil), s.marked...)}
}

var errTimeout = errors.New("timed out")

// await returns the first snapshot for which cond holds, or errTimeout
// with the last one at the deadline.
func (s *store) await(within time.Duration, cond func(snapshot) bool) (snapshot, error) {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		sn := s.snap()
		if cond(sn) {
			return sn, nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return s.snap(), errTimeout
		}
	}
}

// Queries over a snapshot.

func (sn snapshot) find(pred func(*event) bool) *event {
	for i := range sn.events {
		if pred(&sn.events[i]) {
			return &sn.events[i]
		}
	}
	return nil
}

func (sn snapshot) count(pred func(*event) bool) int {
	n := 0
	for i := range sn.events {
		if pred(&sn.events[i]) {
			n++
		}
	}
	return n
}

// writes returns the writes of section id, in order.
func (sn snapshot) writes(id sectionID) []event {
	var out []event
	for _, e := range sn.events {
		if e.Op == "write" && e.section() == id {
			out = append(out, e)
		}
	}
	return out
}

// storeClient is a worker's connection to the store.
type storeClient struct {
	c   net.Conn
	dec *json.Decoder
	enc *json.Encoder
}

func dialStore(addr string) (*storeClient, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &storeClient{c: c, dec: json.NewDecoder(bufio.NewReader(c)), enc: json.NewEncoder(c)}, nil
}

func (sc *storeClient) call(req request) (reply, error) {
	var r reply
	if err := sc.enc.Encode(req); err != nil {
		return r, err
	}
	err := sc.dec.Decode(&r)
	return r, err
}

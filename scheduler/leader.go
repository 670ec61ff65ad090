package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/warden-go/warden/guard"
)

// ErrNotLeader is what an Elector answers while this process does not lead.
var ErrNotLeader = errors.New("warden/scheduler: not the leader")

// WithLeaderElection makes only the leader of election run jobs: the
// Scheduler campaigns from Start until Stop (guard.Guard.Campaign), and a
// node that does not lead skips every slot with the reason "not the
// leader", without touching the job locks or the slot store (a CatchUp
// job's slot once the follower lets it go, having not come to lead by
// then: see CatchUp). The leader still takes each job's lock (runs of a
// job never overlap, even across a change of leader) and its slot claims,
// and records a slot it skips for a held lock as done; a job's context is
// also cancelled when the leadership is lost, and such a run ends as lost.
//
// Leadership saves the followers their lock attempts and keeps every job of
// the cluster on one node. Once per slot across a change of leader still
// needs a slot store: the new leader's clock may name a slot the old one
// already ran.
func WithLeaderElection(election string) Option {
	return func(c *config) { c.election, c.electionSet = election, true }
}

// candidate campaigns for an election for as long as its context lives,
// and again after every term that ends, and knows the current term.
type candidate struct {
	g        *guard.Guard
	election string
	logger   *slog.Logger

	mu   sync.Mutex
	term *guard.Leadership // nil while not leading
	// won is closed when a term begins, and replaced for the next one.
	won chan struct{}

	done chan struct{}
}

func newCandidate(g *guard.Guard, election string, logger *slog.Logger) (*candidate, error) {
	if err := guard.ValidateElection(election); err != nil {
		return nil, fmt.Errorf("%w: %w", guard.ErrInvalidOption, err)
	}
	return &candidate{g: g, election: election, logger: logger, won: make(chan struct{}), done: make(chan struct{})}, nil
}

// leading returns the current term, or nil.
func (c *candidate) leading() *guard.Leadership {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.term != nil && c.term.Err() != nil {
		return nil
	}
	return c.term
}

func (c *candidate) set(ld *guard.Leadership) {
	c.mu.Lock()
	c.term = ld
	if ld != nil {
		close(c.won)
		c.won = make(chan struct{})
	}
	c.mu.Unlock()
}

// await returns the current term, or the next one to begin within wait,
// or nil when none does or ctx is done first.
func (c *candidate) await(ctx context.Context, wait time.Duration) *guard.Leadership {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		c.mu.Lock()
		term, won := c.term, c.won
		c.mu.Unlock()
		if term != nil && term.Err() == nil {
			return term
		}
		select {
		case <-won:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// run campaigns until ctx is done, then resigns the term it holds.
func (c *candidate) run(ctx context.Context) {
	defer close(c.done)
	retry := time.Duration(0)
	for ctx.Err() == nil {
		ld, err := c.g.Campaign(ctx, c.election)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A backend that fails at once must not be hammered; the
			// pause grows to a third of the TTL, the time a term takes to
			// change hands anyway.
			retry = min(max(2*retry, 50*time.Millisecond), c.g.TTL()/3)
			c.logger.Warn("warden/scheduler: campaign failed; retrying", "election", c.election, "retry_in", retry, "error", err)
			t := time.NewTimer(retry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		retry = 0
		c.set(ld)
		c.logger.Info("warden/scheduler: elected leader", "election", c.election, "term", ld.Term())
		select {
		case <-ld.Context().Done():
			if errors.Is(ld.Err(), guard.ErrLockLost) {
				c.logger.Warn("warden/scheduler: leadership lost", "election", c.election, "term", ld.Term(), "error", ld.Err())
			}
		case <-ctx.Done():
		}
		c.set(nil)
		if err := ld.Resign(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, guard.ErrLockLost) {
			c.logger.Warn("warden/scheduler: resigning failed; the seat frees when the lease expires", "election", c.election, "error", err)
		}
	}
}

// Elector returns a go-co-op/gocron/v2 Elector (gocron.WithDistributedElector)
// on election: gocron runs jobs only on the node whose IsLeader answers nil.
// The Elector campaigns from now until the Scheduler's Stop, which resigns;
// the Scheduler need not be started. Each call makes a separate candidate.
func (s *Scheduler) Elector(election string) (gocron.Elector, error) {
	c, err := newCandidate(s.g, election, s.logger)
	if err != nil {
		return nil, err
	}
	if !s.enter() {
		return nil, fmt.Errorf("%w: elector %q", ErrStopped, election)
	}
	go func() {
		defer s.runs.Done()
		c.run(s.ctx)
	}()
	return elector{c}, nil
}

type elector struct{ c *candidate }

// IsLeader implements gocron.Elector.
func (e elector) IsLeader(context.Context) error {
	if e.c.leading() == nil {
		return fmt.Errorf("%w of %q", ErrNotLeader, e.c.election)
	}
	return nil
}

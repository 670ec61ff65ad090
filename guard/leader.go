package guard

import (
	"context"
	"fmt"
	"time"
)

// Leadership is a term as the leader of an election. It is a held lock on
// the election's key, kept alive by the Guard like any other: its context is
// cancelled, with cause ErrLockLost, the moment the term could have ended,
// before any other candidate can be elected, and its term number is the
// lock's fencing token, so storage the leader writes can refuse a deposed
// leader's late writes.
type Leadership struct {
	election string
	lock     *Lock
}

// electionPrefix keeps elections apart from locks of the same name: an
// election is held as the lock electionPrefix+election.
const electionPrefix = "election:"

func electionKey(election string) string { return electionPrefix + election }

// ValidateElection reports why election cannot name an election
// (ErrInvalidKey): it must make a valid key once the prefix "election:" is
// added. Campaign and Observe check it; a caller that campaigns later (a
// scheduler's candidate) can check it up front.
func ValidateElection(election string) error {
	if election == "" {
		return fmt.Errorf("warden: election: %w: empty name", ErrInvalidKey)
	}
	if n := MaxKeyLen - len(electionPrefix); len(election) > n {
		return fmt.Errorf("warden: election %s: %w: %d bytes, more than %d", quote(election), ErrInvalidKey, len(election), n)
	}
	if err := ValidateKey(election); err != nil {
		return fmt.Errorf("warden: election %s: %w", quote(election), err)
	}
	return nil
}

// Campaign waits until this Guard leads election, or ctx is done. ctx bounds
// only the wait: once elected, the term lasts until Resign or until the
// lease is lost, whatever becomes of ctx. Candidates queue on the backend as
// lock waiters do (first come, first served where the backend is fair). opts
// are lock options (TTL, WaitAtMost, Fair).
//
// Resign, or the process ending, ends the term; a candidate that died keeps
// the seat only until its lease expires.
//
// The term is held as the lock "election:"+election in the Guard's
// namespace, which Inspect and ForceRelease take for operators, and which a
// Lock of that key would contend for: keep lock keys out of "election:".
// An election's name is 1 to MaxKeyLen-9 bytes, checked as keys are
// (ErrInvalidKey). A ctx that holds that lock from this Guard (a term's
// Context, or a Lock's of the key) is refused with ErrInvalidOption, where
// a lock would be reentered; under any other, a Guard that leads waits
// behind its own term like any candidate.
func (g *Guard) Campaign(ctx context.Context, election string, opts ...LockOption) (*Leadership, error) {
	if err := ValidateElection(election); err != nil {
		return nil, err
	}
	c := g.lockConfig(opts, false)
	if c.mode != exclusive {
		return nil, wrapLockErr(election, fmt.Errorf("%w: an election is an exclusive lock", ErrInvalidOption))
	}
	key := electionKey(election)
	if ctx != nil {
		// A lock's reentrancy would hand out the lock ctx holds (a term,
		// or a plain Lock of the key) as a Leadership, whose Resign would
		// not end the hold.
		for h := heldBy(ctx); h != nil; h = h.outer() {
			if h.g == g && h.key == key && h.Err() == nil {
				return nil, fmt.Errorf("warden: election %s: %w: ctx holds its lock %s from this Guard already",
					quote(election), ErrInvalidOption, quote(key))
			}
		}
	}
	c.detach = true
	l, err := g.acquire(ctx, key, c)
	if err != nil {
		return nil, err
	}
	return &Leadership{election: election, lock: l}, nil
}

// Election returns the election's name.
func (ld *Leadership) Election() string { return ld.election }

// Term returns the term number: the lease's fencing token, greater than
// every earlier leader's of the same election.
func (ld *Leadership) Term() uint64 { return ld.lock.Token() }

// Context returns a context that carries the values of the one Campaign was
// called with and is cancelled when the term ends: lost (cause wraps
// ErrLockLost) or resigned.
func (ld *Leadership) Context() context.Context { return ld.lock.Context() }

// Err is nil while the term lasts, and says why once it has ended.
func (ld *Leadership) Err() error { return ld.lock.Err() }

// Lock returns the lock the term is held with. Unlocking it is resigning.
func (ld *Leadership) Lock() *Lock { return ld.lock }

// Resign ends the term and gives the seat up, so that the next candidate is
// elected at once instead of after the lease's TTL. It returns an error
// wrapping ErrLockLost when the term had already been lost.
func (ld *Leadership) Resign(ctx context.Context) error { return ld.lock.Unlock(ctx) }

// Leader is an election's leader as an observer sees it.
type Leader struct {
	// Term is the leader's term number, 0 when the seat is empty.
	Term uint64
	// Owner is the label of the leader's Guard (WithOwner).
	Owner string
	// TTL is what was left of the leader's lease when the backend answered,
	// 0 for a lease bound to its holder's session.
	TTL time.Duration
}

// Observe reports the leader of election: the current one at once, then
// each change (a new term, or the seat left empty), until ctx is done, when
// the channel is closed. It polls the backend (driver.Inspector) every
// tenth of the Guard's TTL, between 50ms and 1s, and needs a backend that
// implements it; it returns an error wrapping ErrUnsupported otherwise. A
// reader that falls behind sees only the latest leader, never a stale one.
func (g *Guard) Observe(ctx context.Context, election string) (<-chan Leader, error) {
	if err := ValidateElection(election); err != nil {
		return nil, err
	}
	key := electionKey(election)
	first, err := g.Inspect(ctx, key)
	if err != nil {
		return nil, err
	}
	every := min(max(g.ttl/10, 50*time.Millisecond), time.Second)
	ch := make(chan Leader, 1)
	go func() {
		defer close(ch)
		cur := leaderOf(first)
		ch <- cur
		t := time.NewTicker(every)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			in, err := g.Inspect(ctx, key)
			if err != nil {
				if !failing && ctx.Err() == nil {
					g.logger.Warn("warden: observing an election: the backend did not answer; retrying",
						"election", election, "backend", g.backend, "error", err)
				}
				failing = true
				continue
			}
			failing = false
			next := leaderOf(in)
			if next.Term == cur.Term {
				continue
			}
			cur = next
			// Keep only the latest: drop an unread older leader first.
			select {
			case <-ch:
			default:
			}
			ch <- cur
		}
	}()
	return ch, nil
}

func leaderOf(in Inspection) Leader {
	if len(in.Holders) == 0 {
		return Leader{}
	}
	h := in.Holders[0]
	return Leader{Term: h.Token, Owner: h.Owner, TTL: h.TTL}
}

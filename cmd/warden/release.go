package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// exitChanged is the exit status of a release refused because the lock
// changed hands after the operator was shown its holder (nothing was
// released, and whoever holds it now is named), and of an idempotency
// record's delete refused because the key was claimed again since.
const exitChanged = 3

// changedHands is that refusal.
type changedHands struct {
	key string
	err *driver.HolderChangedError
}

func (e changedHands) Error() string {
	return strconv.Quote(e.key) + " was not released: " + e.err.Error()
}

func (e changedHands) ExitCode() int { return exitChanged }

// recordChanged is the refusal of an idempotency record's delete because
// the record changed after the operator was shown it: another request
// claimed or completed the key, or the claim shown lapsed (the key is free
// again). Nothing was deleted.
type recordChanged struct{ scope, key string }

func (e recordChanged) Error() string {
	return fmt.Sprintf("the record under scope %s, key %s was not deleted: it changed since it was shown (another request claimed the key, or the claim shown lapsed; warden idem show tells its state now)",
		strconv.Quote(e.scope), strconv.Quote(e.key))
}

func (e recordChanged) ExitCode() int { return exitChanged }

// releaseCommand reads the operands of `locks release` and its flags
// (parsed with the others, before or after KEY):
//
//	locks release [-token N | -any-holder] KEY
//
// -token names the holding to release, as `locks show` printed it;
// -any-holder releases whoever holds the key when the release runs. With
// neither, the release is of the one holder the prompt shows; with -yes
// there is no prompt, so one of them is needed.
func (c *cli) releaseCommand(keys []string) (func(context.Context) error, error) {
	switch {
	case len(keys) != 1:
		return nil, badInput("locks release: want KEY")
	case c.tokenSet && c.token == 0:
		return nil, badInput("locks release: -token 0 names no holding")
	case c.tokenSet && c.anyHolder:
		return nil, badInput("locks release: either -token or -any-holder, not both")
	case c.yes && !c.tokenSet && !c.anyHolder:
		return nil, badInput("locks release: -yes needs -token N or -any-holder, so that what is released is what was meant")
	}
	r := release{cli: c, key: keys[0], token: c.token, any: c.anyHolder}
	c.change = &change{
		notDone:   strconv.Quote(r.key) + " was not released",
		mayBeDone: strconv.Quote(r.key) + " may have been released; warden locks show tells",
	}
	return r.run, nil
}

// release is one `locks release`.
type release struct {
	*cli
	key   string
	token uint64 // the holding named with -token, or 0
	any   bool
}

// run shows the holder, asks, and releases: the bound covers the backend's
// calls before the prompt, and starts again after the answer.
func (r release) run(ctx context.Context) error {
	var (
		target guard.ReleaseTarget
		shown  []guard.Holder
	)
	err := r.bounded(ctx, func(ctx context.Context) error {
		in, err := r.g.Inspect(ctx, r.key)
		if err != nil {
			return badKeyOr(err)
		}
		if len(in.Holders) == 0 {
			if note := r.heldUnprefixed(ctx, r.key); note != "" {
				return fmt.Errorf("%s is not held: nothing to release (%s)", strconv.Quote(r.key), note)
			}
			return fmt.Errorf("%s is not held: nothing to release", strconv.Quote(r.key))
		}
		target, shown, err = r.target(in.Holders)
		return err
	})
	if err != nil {
		return r.change.before(ctx, err)
	}
	if !r.yes {
		if err := r.confirm(ctx, shown); err != nil {
			return err
		}
		r.restartBound()
	}
	err = r.bounded(ctx, func(ctx context.Context) error { return r.release(ctx, target) })
	return r.change.sent(ctx, err)
}

// change is what a release or a delete says of itself when the backend's
// answer never came (no answer within the bound, a Ctrl-C, a backend out
// of reach): the operator would read a bare "no answer" either way, as
// "nothing changed" or as "done".
type change struct {
	notDone   string // `"k" was not released`
	mayBeDone string // `"k" may have been released; warden locks show tells`
}

// before is err, a failure before the change's request was sent (opening
// the backend, reading what the prompt shows), saying first that nothing
// was done.
func (ch *change) before(ctx context.Context, err error) error {
	if ch == nil || !unanswered(ctx, err) {
		return err
	}
	return about(ch.notDone, err)
}

// sent is err, the failure of the change's request, saying first that
// nothing was done when the request never left (notSent), and otherwise
// that it may have been done.
func (ch *change) sent(ctx context.Context, err error) error {
	switch {
	case errors.As(err, new(notSent)):
		return about(ch.notDone, err)
	case unanswered(ctx, err):
		return about(ch.mayBeDone, err)
	}
	return err
}

// notSent is the failure of a change's request that changed nothing: it
// never left the client, or the server refused it whole.
type notSent struct{ error }

func (e notSent) Unwrap() error { return e.error }

// notSentOr is err, the failure of a change's request that changed nothing
// before it (a forced release that removed no holder, a record's delete),
// as a notSent when the backend marked it guard.ErrNotSent: the request
// never left, or the server refused it whole. Only the backend can tell: a
// request written on a connection that then broke may have run, and a
// backend whose client's failures do not say whether the server got the
// request (etcd's) leaves them unmarked, which the command says "may have
// been" done.
func notSentOr(err error) error {
	if errors.Is(err, guard.ErrNotSent) {
		return notSent{err}
	}
	return err
}

// unanswered reports whether err is a failure in which the backend's answer
// never came.
func unanswered(ctx context.Context, err error) bool {
	return err != nil && (errors.Is(err, driver.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil)
}

// about is err said after what, "what: err"; guard's "warden: " at the
// start of err's message is dropped, since the command's error line
// starts with it already.
func about(what string, err error) error {
	return &aboutError{what + ": " + strings.TrimPrefix(err.Error(), "warden: "), err}
}

type aboutError struct {
	msg string
	err error
}

func (e *aboutError) Error() string { return e.msg }
func (e *aboutError) Unwrap() error { return e.err }

// release asks the backend to remove target, and says what it removed.
func (r release) release(ctx context.Context, target guard.ReleaseTarget) error {
	removed, err := r.g.ForceRelease(ctx, r.key, target)
	var hc *driver.HolderChangedError
	if errors.As(err, &hc) {
		return r.refused(hc)
	}
	if err != nil && len(removed) == 0 {
		return notSentOr(err)
	}
	// With an error, what a backend removing many holders in several
	// steps removed before a step failed: gone all the same.
	if r.json {
		if perr := r.printJSON(struct {
			Key     string         `json:"key"`
			Removed []guard.Holder `json:"removed"`
		}{r.key, nonNil(removed)}); perr != nil {
			return perr
		}
		return err
	}
	for _, h := range removed {
		fmt.Fprintf(r.stdout, "released %s from %s (token %d)\n", strconv.Quote(r.key), ownerText(h), h.Token)
	}
	if len(removed) == 0 {
		fmt.Fprintf(r.stdout, "%s was freed meanwhile: nothing released\n", strconv.Quote(r.key))
	}
	return err
}

// target is what the release asks the backend to remove, given the holders
// Inspect showed, and the holders the prompt lists.
func (r release) target(holders []guard.Holder) (guard.ReleaseTarget, []guard.Holder, error) {
	switch {
	case r.any:
		return guard.ReleaseTarget{AnyHolder: true}, holders, nil
	case r.token != 0:
		for _, h := range holders {
			if h.Token == r.token {
				return guard.ReleaseTarget{Token: h.Token, Owner: h.Owner}, []guard.Holder{h}, nil
			}
		}
		// The holding named is gone already: the same refusal as the
		// backend's, before anything is asked.
		return guard.ReleaseTarget{}, nil, r.refused(&driver.HolderChangedError{Holders: holders})
	case len(holders) > 1:
		return guard.ReleaseTarget{}, nil, badInput("%s has %d holders: %s; name one with -token N, or release them all with -any-holder",
			strconv.Quote(r.key), len(holders), holdersText(holders))
	}
	h := holders[0]
	return guard.ReleaseTarget{Token: h.Token, Owner: h.Owner}, holders, nil
}

// confirm lists every holder the release will remove and asks.
func (r release) confirm(ctx context.Context, shown []guard.Holder) error {
	var b strings.Builder
	fmt.Fprintf(&b, "release %s from:\n", strconv.Quote(r.key))
	for _, h := range shown {
		fmt.Fprintf(&b, "  %s (%s)\n", holderText(h), leaseText(h))
	}
	if r.any {
		b.WriteString("or from whoever holds it when the release runs.\n")
	}
	b.WriteString("A holder is told when it next hears from the backend; until then only fenced storage refuses its late writes. Release? [y/N] ")
	yes, err := r.ask(ctx, b.String())
	if err != nil {
		return err
	}
	if !yes {
		return errors.New("not released")
	}
	return nil
}

// refused reports a release refused because the holding it named no longer
// holds the lock: on stderr, and with -json on stdout as well.
func (r release) refused(hc *driver.HolderChangedError) error {
	if r.json {
		if err := r.printJSON(struct {
			Key     string         `json:"key"`
			Removed []guard.Holder `json:"removed"`
			HeldBy  []guard.Holder `json:"held_by"`
		}{r.key, []guard.Holder{}, nonNil(hc.Holders)}); err != nil {
			return err
		}
	}
	return changedHands{key: r.key, err: hc}
}

// holderText names a holder as the backend's refusal does: its label
// quoted, so that no character of it reaches the terminal raw, and its
// token.
func holderText(h guard.Holder) string {
	return ownerText(h) + " with token " + strconv.FormatUint(h.Token, 10)
}

func holdersText(hs []guard.Holder) string {
	s := make([]string, len(hs))
	for i, h := range hs {
		s[i] = holderText(h)
	}
	return strings.Join(s, ", ")
}

func ownerText(h guard.Holder) string {
	if h.Owner == "" {
		return "an unlabelled holder"
	}
	return strconv.Quote(h.Owner)
}

func leaseText(h guard.Holder) string {
	if h.SessionBound {
		return "its lease lasts as long as its session"
	}
	return "its lease ends in " + expiresIn(h)
}

package guard

import (
	"context"
	"encoding/json"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden/guard/driver"
)

// Inspection is who holds a lock and who waits for it, as the backend saw it
// at one moment.
type Inspection struct {
	// Key is the key as it was passed to Inspect, without the Guard's
	// prefix.
	Key string `json:"key"`
	// Holders are the live holders, oldest grant first; none when the lock
	// is free.
	Holders []Holder `json:"holders"`
	// Waiters counts the contenders queued on the server, or is -1 where the
	// backend's waiters poll or listen instead of queueing.
	Waiters int `json:"waiters"`
	// Err is set by List alone, for a lock it found but could not read
	// (see List): the backend's refusal. Holders and Waiters then say
	// nothing, not even that the lock is held.
	Err error `json:"-"`
}

// Holder is one live holder of a lock. Its TTL is what was left of its lease
// on the server's clock when the server answered; it is 0 for a lease that
// lives as long as its holder's session (SessionBound).
type Holder = driver.Holding

// Inspect reports who holds key (in the Guard's namespace) and how many wait
// for it, without taking it. It needs a backend that implements
// driver.Inspector, and returns an error wrapping ErrUnsupported otherwise.
func (g *Guard) Inspect(ctx context.Context, key string) (Inspection, error) {
	if ctx == nil {
		return Inspection{}, wrapLockErr(key, fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	full, err := g.names.full(g.prefix, key)
	if err != nil {
		return Inspection{}, wrapLockErr(key, err)
	}
	in, ok := g.locker.(driver.Inspector)
	if !ok {
		return Inspection{}, wrapLockErr(key, fmt.Errorf("%w: inspection on %s", ErrUnsupported, g.backend))
	}
	got, err := bounded(g, ctx, func(ictx context.Context) (driver.Inspection, error) { return in.Inspect(ictx, full) })
	if err != nil {
		return Inspection{}, wrapLockErr(key, err)
	}
	return Inspection{Key: key, Holders: got.Holders, Waiters: got.Waiters}, nil
}

// ReleaseTarget names what ForceRelease removes: the holding an operator
// saw (Token, and Owner to make sure), or, explicitly, any holder.
type ReleaseTarget = driver.ReleaseTarget

// ErrHolderChanged: ForceRelease found the lock held, but not by the holding
// it was told to remove, and removed nothing. The error it comes in is a
// *driver.HolderChangedError, which names the holders found instead.
var ErrHolderChanged = driver.ErrHolderChanged

// ForceRelease takes key (in the Guard's namespace) away from the holding
// target names, for an operator freeing a lock whose holder hangs: pass the
// Token (and Owner) of the Holder that Inspect showed, and the backend
// removes that holding and no other, checking in the same atomic step that
// it still holds; if the lock changed hands meanwhile, nothing is removed
// and the error matches ErrHolderChanged, naming who holds it now. Only
// target.AnyHolder removes whoever holds the key when the backend answers.
// It returns the holders removed, none when the lock was free; with an
// error, those a backend that removes many holders in several steps
// (consullock) had removed when a later step failed.
//
// The backend first makes the next token greater than every token issued
// (so fenced storage refuses the old holder's late writes), then removes the
// holding. The old holder's context is cancelled at its next renewal at the
// latest, or, for a lease its backend keeps on a session (etcd, ZooKeeper,
// Consul), as soon as the holder's process hears of the removal
// (driver.RevocableLease); a process cut off from the backend learns of it
// only when its session ends, and until then fenced storage is what stops
// it. It is logged at WARN and traced as an admin action. It needs a
// backend that implements driver.ForceReleaser; ErrUnsupported otherwise.
//
// An error matching ErrNotSent says that nothing was removed: the request
// never left, or the backend refused it whole. Any other error, however
// unavailable the backend looks, may have come after the holding was
// removed (its answer lost, the Guard's call timeout ended first): Inspect
// tells. etcdlock's errors are never marked (see its documentation).
func (g *Guard) ForceRelease(ctx context.Context, key string, target ReleaseTarget) ([]Holder, error) {
	if ctx == nil {
		return nil, wrapLockErr(key, fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	full, err := g.names.full(g.prefix, key)
	if err != nil {
		return nil, wrapLockErr(key, err)
	}
	if !target.AnyHolder && target.Token == 0 {
		return nil, wrapLockErr(key, fmt.Errorf("%w: a forced release names the token of the holding to remove, or AnyHolder", ErrInvalidOption))
	}
	fr, ok := g.locker.(driver.ForceReleaser)
	if !ok {
		return nil, wrapLockErr(key, fmt.Errorf("%w: forced release on %s", ErrUnsupported, g.backend))
	}
	var span trace.Span
	if tracer := g.tel.tracerFor(ctx); tracer != nil {
		_, span = g.tel.startSpan(ctx, tracer, "warden.force_release", key)
	}
	removed, err := bounded(g, ctx, func(fctx context.Context) ([]driver.Holding, error) { return fr.ForceRelease(fctx, full, target) })
	if err != nil && len(removed) == 0 {
		endSpan(span, outcomeError, err)
		return nil, wrapLockErr(key, err)
	}
	// One attribute for each field, whatever the number of holders: a
	// record with a key twice (shared and semaphore locks have several)
	// keeps only its last value in most readers of JSON logs.
	owners, tokens := make(labels, len(removed)), make([]uint64, len(removed))
	for i, h := range removed {
		owners[i], tokens[i] = h.Owner, h.Token
	}
	g.tel.forceReleased.Add(ctx, int64(len(removed)), g.tel.onBackend...)
	if err != nil {
		// Removed in part: those holders are gone all the same.
		g.logger.WarnContext(ctx, "warden: lock released in part by an operator",
			"key", key, "backend", g.backend, "removed", len(removed), "owners", owners, "tokens", tokens, "error", err)
		endSpan(span, outcomeError, err, attribute.Int("warden.removed", len(removed)))
		return removed, wrapLockErr(key, err)
	}
	g.logger.WarnContext(ctx, "warden: lock released by an operator",
		"key", key, "backend", g.backend, "removed", len(removed), "owners", owners, "tokens", tokens)
	endSpan(span, "force_released", nil, attribute.Int("warden.removed", len(removed)))
	return removed, nil
}

// labels are owner labels in a log record, written as a JSON array by the
// text handler too: it printed a []string as [a b c], which cannot tell
// two owners from one with a space in it.
type labels []string

func (l labels) MarshalJSON() ([]byte, error) { return json.Marshal([]string(l)) }

func (l labels) MarshalText() ([]byte, error) { return l.MarshalJSON() }

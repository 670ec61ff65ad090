package redislock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/rediseval"
	"github.com/warden-go/warden/backends/internal/redisrefusal"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

var (
	//go:embed idem_claim.lua
	idemClaimSrc string
	//go:embed idem_update.lua
	idemUpdateSrc string
	//go:embed idem_get.lua
	idemGetSrc string
	//go:embed idem_delete.lua
	idemDeleteSrc string
)

// Store is an idempotency.Store on Redis: one hash per record, each call
// one script. A record lives as long as its key: the claim's lease, then the
// completed record's retention, is the key's expiry (PEXPIRE), counted by
// Redis on its own clock as a lock's PX is, so that a first request costs 8
// server commands (claim: EVALSHA, HMGET, HSET, PEXPIRE; complete the same)
// and a replay 2 (EVALSHA_RO, HMGET: Get runs its script read-only, as
// Inspect does, so that a user allowed only to read the records may). It
// is safe for concurrent use.
//
// A call the server refuses for good (an ACL user without the store's keys
// or a command its scripts call, NOPERM, or EVALSHA renamed away) fails
// with the server's words wrapping idempotency.ErrInvalid, not
// ErrUnavailable: an Executor passes it on rather than as an outage, so
// that httpmw's WithFailOpen does not serve keyed requests unguarded until
// someone mends the setup. Authentication errors (NOAUTH, WRONGPASS) stay
// ErrUnavailable, as for the Locker: a credentials provider of short-lived
// tokens may hand a fresh one to the next connection.
type Store struct {
	client                      goredis.UniversalClient
	sc                          *scripter // client, for scripts
	prefix                      string
	claim, update, read, remove *goredis.Script
}

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithStorePrefix sets the prefix of the store's keys (default
// "warden:idem:"). The store has no guard above it to namespace its keys, so
// it keeps a prefix of its own.
func WithStorePrefix(prefix string) StoreOption { return func(s *Store) { s.prefix = prefix } }

// NewStore returns a store that keeps its records on client, which the
// caller keeps ownership of. A nil client or option is an error wrapping
// driver.ErrInvalidOption.
func NewStore(client goredis.UniversalClient, opts ...StoreOption) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", driver.ErrInvalidOption)
	}
	s := &Store{
		client: client,
		sc:     newScripter(client),
		prefix: "warden:idem:",
		claim:  goredis.NewScript(idemClaimSrc),
		update: goredis.NewScript(idemUpdateSrc),
		read:   goredis.NewScript(idemGetSrc),
		remove: goredis.NewScript(idemDeleteSrc),
	}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil StoreOption (argument %d)", driver.ErrInvalidOption, i)
		}
		o(s)
	}
	return s, nil
}

var (
	_ idempotency.Store           = (*Store)(nil)
	_ idempotency.DeadlineBounded = (*Store)(nil)
)

// BoundedByDeadline implements idempotency.DeadlineBounded: true on the
// clients Locker.BoundedByDeadline is true on (a go-redis Client made with
// ContextTimeoutEnabled, with timeouts that set deadlines), for the reasons
// it gives.
// Every call of the Store is one script on the client, with nothing left
// to do after it.
func (s *Store) BoundedByDeadline() bool { return honoursDeadlines(s.client) }

// recordKey is binary-safe and unambiguous: the scope's length tells where
// it ends.
func (s *Store) recordKey(scope, key string) string {
	return s.prefix + strconv.Itoa(len(scope)) + ":" + scope + ":" + key
}

// Claim implements idempotency.Store.
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), c.Check()); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	v, err := s.claim.Run(ctx, s.sc, []string{s.recordKey(c.Scope, c.Key)}, c.Owner, c.Fingerprint, ms(c.Lease)).Result()
	if err != nil {
		return nil, storeErr(ctx, "claim", err, driver.Unavailable)
	}
	return record(c.Scope, c.Key, v)
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(lease)); err != nil {
		return err
	}
	return s.change(ctx, scope, key, owner, "extend", ms(lease), "")
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(retention), idempotency.CheckResponse(response)); err != nil {
		return err
	}
	return s.change(ctx, scope, key, owner, "complete", ms(retention), string(response))
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner)); err != nil {
		return err
	}
	return s.change(ctx, scope, key, owner, "abandon", 0, "")
}

func (s *Store) change(ctx context.Context, scope, key, owner, op string, d int64, response string) error {
	if err := ctx.Err(); err != nil {
		return driver.NotSent(err)
	}
	// Complete and Abandon are sent once, as releases are (see
	// scripter.evalshaOnce): sent again after an answer lost, each would
	// find its own change made and answer ErrNotOwner. An extension sent
	// again only extends again.
	cmd := []any{"evalsha", s.update.Hash(), 1, s.recordKey(scope, key), owner, op, d, response}
	eval := rediseval.EvalOnce
	if op == "extend" {
		eval = rediseval.Eval
	}
	n, err := s.sc.run(ctx, idemUpdateSrc, cmd, eval).Int64()
	switch {
	case err != nil && op == "extend":
		return storeErr(ctx, op, err, driver.Unavailable)
	case err != nil:
		return storeErr(ctx, op, err, onceErr)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s of %q", idempotency.ErrNotOwner, op, key)
	}
	return nil
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	v, err := s.sc.runReadOnly(ctx, s.read, []string{s.recordKey(scope, key)}).Result()
	if err != nil {
		return nil, storeErr(ctx, "get", err, driver.Unavailable)
	}
	rec, err := record(scope, key, v)
	if err == nil && rec == nil {
		return nil, fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
	}
	return rec, err
}

// Delete implements idempotency.Deleter.
func (s *Store) Delete(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return driver.NotSent(err)
	}
	// Sent once, as Complete is: sent again after an answer lost, it would
	// find the record gone and answer ErrNotFound.
	n, err := s.sc.evalshaOnce(ctx, idemDeleteSrc, []any{"evalsha", s.remove.Hash(), 1, s.recordKey(scope, key), owner}).Int64()
	switch {
	case err != nil:
		return storeErr(ctx, "delete", err, onceErr)
	case n < 0:
		return fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
	case n == 0:
		return fmt.Errorf("%w: delete of %q: the record has another owner", idempotency.ErrNotOwner, key)
	}
	return nil
}

// storeErr classifies err, the server's answer to the Store's op, as
// classify does, but for a refusal no retry outlasts (see Store), which
// wraps idempotency.ErrInvalid and the server's words, without
// ErrUnavailable: an Executor makes any error but an ErrInvalid an
// outage. What classify proves of the change (driver.NotSent) holds for
// it too.
func storeErr(ctx context.Context, op string, err error, classify func(context.Context, error) error) error {
	cerr := classify(ctx, err)
	if ctx.Err() != nil || !redisrefusal.Permanent(err) {
		return cerr
	}
	err = fmt.Errorf("%w: idempotency %s refused by the server for good, a setup to mend (the ACL lines that work are in redislock's documentation): %w",
		idempotency.ErrInvalid, op, err)
	if errors.Is(cerr, driver.ErrNotSent) {
		return driver.NotSent(err)
	}
	return err
}

// record decodes a script's answer: 0 for none, else the record's fields.
func record(scope, key string, v any) (*idempotency.Record, error) {
	fields, ok := v.([]any)
	if !ok {
		return nil, nil
	}
	if len(fields) != 4 {
		return nil, fmt.Errorf("%w: malformed record %q", idempotency.ErrUnavailable, key)
	}
	str := func(i int) string { s, _ := fields[i].(string); return s }
	r := &idempotency.Record{
		Scope: scope, Key: key,
		State:       idempotency.State(str(0)),
		Fingerprint: str(1),
		Owner:       str(2),
	}
	if s, ok := fields[3].(string); ok {
		r.Response = []byte(s)
	}
	return r, nil
}

// ms converts a positive duration to whole milliseconds, rounded up as the
// locks' TTLs are (pxOf): rounded down, a lease of 1.999ms was kept for 1ms,
// which for a lease of a few milliseconds is past the Executor's margin.
func ms(d time.Duration) int64 { return max(1, pxOf(d)) }

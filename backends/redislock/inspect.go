package redislock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/redisrefusal"
	"github.com/warden-go/warden/backends/internal/redistag"
	"github.com/warden-go/warden/guard/driver"
)

// ownerID is what a lease is stored under: a random id that tells this
// lease from every other, then the holder's label for Inspect. The id is
// base32, so the first '/' ends it.
//
// The id is crypto/rand.Text's: 26 random characters of the RFC 4648
// base32 alphabet, 130 bits. It is written with the label into one
// string, an allocation less on every acquisition than Text's own
// string and its concatenation.
func ownerID(label string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	var id [26]byte
	rand.Read(id[:])
	for i, c := range id {
		id[i] = alphabet[c%32]
	}
	var b strings.Builder
	b.Grow(len(id) + 1 + len(label))
	b.Write(id[:])
	if label != "" {
		b.WriteByte('/')
		b.WriteString(label)
	}
	return b.String()
}

func labelOf(owner string) string {
	_, label, _ := strings.Cut(owner, "/")
	return label
}

// Inspect implements driver.Inspector for plain and fair locks (the keys
// Acquire takes). Its token is the holder's, read from the lock's state
// with its owner and deadline. Waiters counts
// the fair queue and the live recorded waiters of plain locks.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	n := mutexNamesOf(key)
	r, err := l.sc.runReadOnly(ctx, l.s.inspect, []string{n.lock, n.queue, n.waiters}).Slice()
	if err != nil {
		return driver.Inspection{}, driver.Unavailable(ctx, err)
	}
	if len(r) != 4 {
		return driver.Inspection{}, fmt.Errorf("%w: inspect answered %d values, want 4", driver.ErrUnavailable, len(r))
	}
	queued, _ := r[3].(int64)
	in := driver.Inspection{Waiters: int(queued)}
	owner, ok := r[0].(string)
	if !ok {
		return in, nil
	}
	pttl, _ := r[1].(int64)
	token, _ := r[2].(int64)
	in.Holders = []driver.Holding{{Owner: labelOf(owner), Token: uint64(token), TTL: time.Duration(max(pttl, 0)) * time.Millisecond}}
	return in, nil
}

// List implements driver.Lister. Redis keeps no index of lock names, so
// each page SCANs every master for the prefix's lock keys and sorts them:
// a page costs a pass over the keyspace, which suits an operator's tool,
// not a hot path. The keys of locks released in the last day or two are
// found too, and left out with one pipelined GET per 1000 names. SCAN shows
// every key to a user whose ACL key patterns leave some out: a lock whose
// keys the server refuses to read to it (NOPERM for a key) is listed with
// that refusal as its Err. A refusal of a command (a user without GET or
// EVALSHA) is the same for every lock, and fails the page.
func (l *Locker) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: list limit %d", driver.ErrInvalidOption, limit)
	}
	pattern := "{" + globEscape(redistag.Escape(prefix)) + "*}:lock"
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, c *goredis.Client) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			inner, ok := strings.CutSuffix(strings.TrimPrefix(it.Val(), "{"), "}:lock")
			if !ok {
				continue
			}
			key, ok := redistag.Unescape(inner)
			if ok && strings.HasPrefix(key, prefix) && key > after {
				mu.Lock()
				keys = append(keys, key)
				mu.Unlock()
			}
		}
		return it.Err()
	}
	var err error
	switch c := l.client.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *goredis.Client:
		err = scan(ctx, c)
	default:
		return nil, fmt.Errorf("%w: listing locks on a %T", driver.ErrUnsupported, l.client)
	}
	if err != nil {
		return nil, driver.Unavailable(ctx, err)
	}
	slices.Sort(keys)
	var out []driver.Listed
	for len(keys) > 0 && len(out) < limit {
		// A released lock keeps its key, free, for a day or two (see
		// state.lua): one pipelined GET per page of names leaves those
		// out before each held one is inspected on its own.
		page := keys[:min(len(keys), 1000)]
		keys = keys[len(page):]
		held, err := l.notReleased(ctx, page)
		if err != nil {
			return nil, driver.Unavailable(ctx, err)
		}
		for _, h := range held {
			if len(out) == limit {
				break
			}
			if h.Err != nil {
				out = append(out, h)
				continue
			}
			in, err := l.Inspect(ctx, h.Key)
			switch {
			case redisrefusal.KeyDenied(err):
				out = append(out, driver.Listed{Key: h.Key, Err: err})
			case err != nil:
				return nil, err
			case len(in.Holders) > 0: // it may have been released since the scan
				out = append(out, driver.Listed{Key: h.Key, Inspection: in})
			}
		}
	}
	return out, nil
}

// notReleased keeps the keys whose lock's state is not a released one (no
// owner), in order: those may be held. A key whose state the server refuses
// to read (an ACL user whose key patterns leave it out, NOPERM: SCAN
// shows every key) is kept with that refusal as its Err, the error Inspect
// would return; a key whose node redirects the GET, its slot moving or
// moved (see migrating), is kept for Inspect, which follows the slot; any
// other failure, a refused GET included, fails them all. The states are
// read on the masters, as Inspect reads them: a replica's may lag, and
// leave a held lock out.
func (l *Locker) notReleased(ctx context.Context, keys []string) ([]driver.Listed, error) {
	gets := make([]*goredis.StringCmd, len(keys))
	if !l.sc.readsReplicas() {
		pipe := l.client.Pipeline()
		for i, k := range keys {
			gets[i] = pipe.Get(ctx, lockKeyOf(k))
		}
		// Exec returns the first command's failure; each is judged below.
		pipe.Exec(ctx)
	} else {
		// The client would send GET to replicas: one pipeline per master
		// (see masterConn).
		batches := make(map[*goredis.Client][]goredis.Cmder)
		for i, k := range keys {
			m, err := l.sc.cluster.MasterForKey(ctx, lockKeyOf(k))
			if err != nil {
				return nil, err
			}
			gets[i] = goredis.NewStringCmd(ctx, "get", lockKeyOf(k))
			batches[m] = append(batches[m], gets[i])
		}
		for m, cmds := range batches {
			l.sc.masterConn(m).exec(ctx, cmds...)
		}
	}
	var out []driver.Listed
	for i, g := range gets {
		v, err := g.Result()
		switch {
		case errors.Is(err, goredis.Nil):
		case redisrefusal.KeyDenied(err):
			out = append(out, driver.Listed{Key: keys[i], Err: driver.Unavailable(ctx, err)})
		case isReply(err) && migrating(err):
			// A node that holds the key no more: Inspect finds it.
			out = append(out, driver.Listed{Key: keys[i]})
		case err != nil:
			return nil, err
		case !released(v):
			out = append(out, driver.Listed{Key: keys[i]})
		}
	}
	return out, nil
}

// released tells the state of a released plain or fair lock, which ends
// with its empty owner, '<deadline>:<token>:<day>:<waiting>:', or with the
// mark ForceRelease leaves in its place.
func released(state string) bool {
	f := strings.SplitN(state, ":", 5)
	return len(f) == 5 && (f[4] == "" || strings.HasPrefix(f[4], forcedOwner))
}

// globEscape keeps the characters SCAN's pattern gives a meaning to literal.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// ForceRelease implements driver.ForceReleaser for plain and fair locks, in
// one script that checks the holder and removes it. The token Inspect
// reports, and the one target names, is the holder's own, which each grant
// replaces: while it is unchanged and the lock is held, the holder is the
// one that was seen. The old holder finds its lease gone at its next
// renewal, a third of its TTL later at most, and its section's context is
// cancelled then, with a cause that names ForceRelease: the free state left
// says which token it removed (see force_release.lua), and a holder that
// finds another's since, before its own deadline, knows it did not expire. A failure that proves the script ran none of its writes
// (never sent, a context already done; refused whole: see onceErr)
// matches driver.ErrNotSent.
func (l *Locker) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	if err := ctx.Err(); err != nil {
		// Known not sent, which go-redis's error would not tell.
		return nil, driver.NotSent(err)
	}
	n := mutexNamesOf(key)
	anyHolder, withLabel := "0", "0"
	if target.AnyHolder {
		anyHolder = "1"
	}
	if target.Owner != "" {
		withLabel = "1"
	}
	// Sent once, as a release is (scripter.evalshaOnce): sent again after
	// its answer was lost, it found the lock freed by the first, or handed
	// to a waiter, and answered that nothing was removed, or that the lock
	// had changed hands.
	r, err := l.sc.evalshaOnce(ctx, l.s.forceReleaseBody, []any{"evalsha", l.s.forceRelease.Hash(), 4, n.lock, n.queue, n.deadlines, n.waiters,
		n.channel, anyHolder, strconv.FormatUint(target.Token, 10), withLabel, target.Owner}).Slice()
	if err != nil {
		return nil, onceErr(ctx, err)
	}
	if len(r) != 4 {
		return nil, fmt.Errorf("%w: force release answered %d values, want 4", driver.ErrUnavailable, len(r))
	}
	owner, ok := r[0].(string)
	if !ok {
		return nil, nil
	}
	token, _ := r[1].(int64)
	pttl, _ := r[2].(int64)
	removed, _ := r[3].(int64)
	h := []driver.Holding{{Owner: labelOf(owner), Token: uint64(token), TTL: time.Duration(max(pttl, 0)) * time.Millisecond}}
	if removed != 1 {
		return nil, driver.HolderChanged(h)
	}
	return h, nil
}

package redislock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/notheld"
	"github.com/warden-go/warden/guard/driver"
)

type kind uint8

const (
	kindMutex kind = iota
	kindRead
	kindWrite
	kindPermit
)

// lease is one holding of a lock, a read or write lock or a permit. It keeps
// only what cannot be derived: the Redis key names are built from key when a
// call needs them, so that a held lock costs little memory.
type lease struct {
	l     *Locker
	key   string
	owner string // random, unguessable: the proof of ownership every call presents
	token uint64
	// expiry is Expiry as nanoseconds after epoch, so that a refresh can move
	// it while guard reads it, without a lock.
	expiry atomic.Int64
	kind   kind
	// waiting is the waiting flag of a plain or fair lock's state when it
	// was granted (see state.lua): its release writes it back, unread, so
	// that under contention the flag costs no command of its own.
	waiting byte
	// fair: a fair lock's, whose release may have fair waiters to wake.
	fair bool
	// day is when the key of a plain or fair lock's state expires, as its
	// grant or latest refresh set it (see state.lua): a release writes it
	// back with the free state, unread.
	day atomic.Uint32
}

// dayOf is the day a grant sent at sent with a PX of px sets, by this
// process's clock: a plain lock's grant that found nobody waiting does not
// say (see acquire.lua). It only spares the release a write: a release
// whose day is not the state's writes the state's day back in the same
// script, so a clock off by enough to cross midnight costs a command, and
// nothing else.
func dayOf(sent time.Time, px int64) uint32 {
	return uint32((sent.UnixMilli()+px)/86_400_000 + 2)
}

// epoch anchors lease expiries on the monotonic clock.
var epoch = time.Now()

// expiryAllowance is subtracted from every expiry: the deadlines of leases
// kept in sorted sets are counted on the server's clock in whole
// milliseconds, which can end up to 1ms before send time plus TTL.
const expiryAllowance = time.Millisecond

// renewed records that a request sent at sent granted or extended the lease
// for px milliseconds.
func (ls *lease) renewed(sent time.Time, px int64) {
	// Add and Sub saturate where a sum would overflow: a TTL of
	// math.MaxInt64 was an expiry in the past.
	d := time.Duration(math.MaxInt64)
	if px < int64(d/time.Millisecond) {
		d = time.Duration(px) * time.Millisecond
	}
	ls.expiry.Store(int64(sent.Add(d - expiryAllowance).Sub(epoch)))
}

// Token implements driver.Lease: the key's counter in Redis.
func (ls *lease) Token() uint64 { return ls.token }

// Expiry implements driver.Lease.
func (ls *lease) Expiry() time.Time { return epoch.Add(time.Duration(ls.expiry.Load())) }

// Refresh implements driver.Lease: it extends the lease to ttl from now,
// counted by Redis.
func (ls *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	px := pxOf(ttl)
	s, keys, args := ls.refreshCall(px)
	sent := time.Now()
	n, why, err := refreshAnswer(s.Run(ctx, ls.l.sc, keys, args...))
	return ls.refreshed(ctx, sent, px, n, why, err)
}

// refreshAnswer reads a refresh script's answer: a number (a plain or fair
// lock's day, 1 for other leases) when extended, else 0 or, from
// refresh_lock.lua, a letter for why not.
func refreshAnswer(c *goredis.Cmd) (n int64, why byte, err error) {
	v, err := c.Result()
	switch v := v.(type) {
	case int64:
		return v, 0, err
	case string:
		if len(v) == 1 {
			return 0, v[0], err
		}
	}
	if err == nil {
		err = fmt.Errorf("%w: a refresh answered %v", driver.ErrUnavailable, v)
	}
	return 0, 0, err
}

func (ls *lease) refreshCall(px int64) (*goredis.Script, []string, []any) {
	sc := ls.l.s
	if ls.kind == kindMutex {
		return sc.refreshLock, []string{lockKeyOf(ls.key)}, []any{ls.owner, px, ls.token}
	}
	n := namesOf(ls.key)
	switch ls.kind {
	case kindRead:
		return sc.zrefresh, []string{n.readers()}, []any{ls.owner, px}
	case kindWrite:
		return sc.refresh, []string{n.writer()}, []any{ls.owner, px}
	default:
		return sc.zrefresh, []string{n.permits()}, []any{ls.owner, px}
	}
}

// refreshed takes the answer of a refresh sent at sent: n, or why not.
func (ls *lease) refreshed(ctx context.Context, sent time.Time, px, n int64, why byte, err error) error {
	if err != nil {
		return driver.Unavailable(ctx, err)
	}
	if n == 0 {
		return ls.notHeld(why, "")
	}
	if ls.kind == kindMutex {
		ls.day.Store(uint32(n))
	}
	ls.renewed(sent, px)
	return nil
}

// Release implements driver.Lease: it gives the lease up, only if it is
// still this owner's.
func (ls *lease) Release(ctx context.Context) error {
	n, err := ls.releaseOn(ctx, ls.l.sc)
	if err != nil {
		return driver.Unavailable(ctx, err)
	}
	if n == 0 {
		var why byte
		if ls.kind == kindMutex {
			why = ls.whyReleaseRefused(ctx)
		}
		return ls.notHeld(why, " before release")
	}
	if n >= 2 {
		// Made here, not kept in the lease: only a contended release
		// pays for it, not every held lock.
		ls.l.handedOff.Store(&handoff{key: ls.key, at: time.Now(), clock: n})
	}
	return nil
}

// notHeld is the error of a renewal or a release (when says which, see
// notheld.Error) that found the lease no longer its owner's, for why, a
// letter of refresh_lock.lua's.
func (ls *lease) notHeld(why byte, when string) error {
	w := notheld.Unknown
	switch why {
	case 'f':
		w = notheld.Forced
	case 'e':
		w = notheld.Expired
	case 't':
		w = notheld.Later
	case 'r':
		w = notheld.Released
	case 'g':
		w = notheld.Gone
	}
	return notheld.Error(w, ls.Expiry(), when)
}

// whyReleaseRefused reads the state of a plain or fair lock whose release
// release.lua refused, which answers no reason (0 if the read fails), for
// the letter refresh_lock.lua would answer: one command more, on a release
// that failed already. The state may have changed since the refusal, and
// the GET goes where the client sends it (a replica, for a ClusterClient
// with ReadOnly set), which can make the reason vaguer, never another
// lease's: a ForceRelease's state names the token it removed, and a later
// token or this lease's own release was written once.
func (ls *lease) whyReleaseRefused(ctx context.Context) byte {
	v, err := ls.l.client.Get(ctx, lockKeyOf(ls.key)).Result()
	if errors.Is(err, goredis.Nil) {
		return 'g'
	}
	f := strings.SplitN(v, ":", 5)
	if err != nil || len(f) != 5 {
		return 0
	}
	token, err := strconv.ParseUint(f[1], 10, 64)
	switch owner := f[4]; {
	case err != nil:
	case owner == forcedOwner+strconv.FormatUint(ls.token, 10):
		return 'f'
	case token > ls.token:
		return 't'
	case owner == "" && token == ls.token:
		return 'r'
	}
	return 0
}

// forcedOwner begins the owner of the free state ForceRelease leaves, the
// removed holder's token following (see force_release.lua).
const forcedOwner = "!forced:"

// handoff is what a release that handed the lock to a waiter, or reserved
// it for one, leaves for the releaser's next acquisition of the key (see
// Locker.handedOff).
type handoff struct {
	key string
	// clock is the server's clock (ms) when it granted or reserved the
	// lock for the waiter, which the release answers; at is when the
	// release was answered.
	clock int64
	at    time.Time
}

// releaseOn runs the owner-checked release script: one round trip that
// frees the lease and, when someone waits, tells one waiter.
func (ls *lease) releaseOn(ctx context.Context, sc goredis.Scripter) (int64, error) {
	s := ls.l.s
	if ls.kind == kindMutex {
		if sc == goredis.Scripter(ls.l.sc) {
			if ls.waiting < 2 && !ls.fair {
				// No fair waiter announced itself at the grant, so
				// none is likely to: the queue's keys are left out
				// (see release_head.lua), and sent only if one did.
				// The strings and the token go in as pointers, which
				// cost no allocation as interface values (see
				// plainContender.cmd). A release whose grant found
				// nobody waiting sends the free state and the end of
				// its own, made here: two arguments, not three, and
				// no concatenation for the server.
				p := plainReleaseOf(ls.key, ls.owner, ls.token, ls.day.Load())
				var cmd []any
				if ls.waiting == 0 {
					cmd = []any{"evalsha", s.releaseSha, 2, &p.lock, &p.waiters, &p.free, &p.mine}
				} else {
					cmd = []any{"evalsha", s.releaseSha, 2, &p.lock, &p.waiters, &ls.owner, &ls.token, ls.day.Load(), "1"}
				}
				if r, err := ls.l.sc.evalshaOnce(ctx, s.releaseSrc, cmd).Int64(); err != nil || r != -1 {
					return r, err
				}
			}
			n := mutexNamesOf(ls.key)
			cmd := []any{"evalsha", s.releaseSha, 4, n.lock, n.queue, n.deadlines, n.waiters,
				ls.owner, ls.token, ls.day.Load(), n.channel, waitingFlag(ls.waiting)}
			return ls.l.sc.evalshaOnce(ctx, s.releaseSrc, cmd).Int64()
		}
		n := mutexNamesOf(ls.key)
		return s.release.Run(ctx, sc, n.releaseKeys(), ls.owner, ls.token, ls.day.Load(), n.channel, waitingFlag(ls.waiting)).Int64()
	}
	n := namesOf(ls.key)
	// A read lease or a permit is a member of a sorted set, a write lease
	// a key of its own.
	script, src := s.zrelease, zreleaseSrc
	keys, args := []string{n.permits()}, []any{ls.owner, n.channel(), "1"}
	switch ls.kind {
	case kindRead:
		keys[0], args[2] = n.readers(), "0"
	case kindWrite:
		script, src = s.writeRelease, writeReleaseSrc
		keys[0], args = n.writer(), args[:2]
	}
	if sc != goredis.Scripter(ls.l.sc) {
		// The connection of a WithWaitReplicas acquisition, which gives
		// the lease back after a failed WAIT and reads no answer.
		return script.Run(ctx, sc, keys, args...).Int64()
	}
	return ls.l.sc.evalshaOnce(ctx, src, append([]any{"evalsha", script.Hash(), 1, keys[0]}, args...)).Int64()
}

// waitingFlag is a waiting flag as a script reads it.
func waitingFlag(b byte) string {
	switch b {
	case 1:
		return "1"
	case 2:
		return "2"
	}
	return "0"
}

// refreshChunk is how many plain or fair locks one call of
// refresh_locks.lua extends: enough that a batch's commands cost the
// client little per lease, few enough that one call holds the server's
// thread for a few milliseconds at most.
const refreshChunk = 512

// RefreshBatch implements driver.BatchRefresher: one pipelined round trip
// (one per node on a Cluster) refreshes every lease. On a single server or
// a Sentinel's primary, plain and fair locks go in chunks, one script call
// each (see refresh_locks.lua): a command per lease would be kept, with
// its arguments and its answer, until the whole batch is answered, which
// at 100,000 held locks was more heap than the locks themselves. On a
// Cluster, where one script names the keys of one slot only, and for the
// other kinds of leases, each lease is a command of its own. A lease from
// another Locker gets an error wrapping driver.ErrInvalidOption.
func (l *Locker) RefreshBatch(ctx context.Context, leases []driver.Lease, ttl time.Duration) []error {
	errs := make([]error, len(leases))
	mine := make([]*lease, len(leases))
	cmds := make([]*goredis.Cmd, len(leases))
	px := pxOf(ttl)
	_, chunked := l.client.(*goredis.Client)
	// locks are the positions of the leases refreshed in chunks.
	var locks []int
	pipe := l.client.Pipeline()
	for i, g := range leases {
		ls, ok := g.(*lease)
		if !ok || ls.l != l {
			errs[i] = fmt.Errorf("%w: the lease was not granted by this Locker", driver.ErrInvalidOption)
			continue
		}
		mine[i] = ls
		if chunked && ls.kind == kindMutex {
			locks = append(locks, i)
			continue
		}
		s, keys, args := ls.refreshCall(px)
		cmds[i] = s.EvalSha(ctx, pipe, keys, args...)
	}
	chunks := make([]*goredis.Cmd, 0, (len(locks)+refreshChunk-1)/refreshChunk)
	for at := range slices.Chunk(locks, refreshChunk) {
		c := l.refreshLocksCmd(ctx, mine, at, px)
		_ = pipe.Process(ctx, c)
		chunks = append(chunks, c)
	}
	sent := time.Now()
	// Each command's own error is read below.
	_, _ = pipe.Exec(ctx)
	var again, againChunks []int
	for i, c := range cmds {
		if c == nil {
			continue
		}
		if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			again = append(again, i)
			continue
		}
		n, why, err := refreshAnswer(c)
		errs[i] = mine[i].refreshed(ctx, sent, px, n, why, err)
	}
	for j, c := range chunks {
		if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			againChunks = append(againChunks, j)
			continue
		}
		refreshedChunk(ctx, c, chunkAt(locks, j), mine, errs, sent, px)
	}
	if len(again) == 0 && len(againChunks) == 0 {
		return errs
	}
	// The server lost its script cache (restart, SCRIPT FLUSH): send those
	// bodies once; the single-lease calls reload the cache.
	pipe = l.client.Pipeline()
	for _, i := range again {
		s, keys, args := mine[i].refreshCall(px)
		cmds[i] = s.Eval(ctx, pipe, keys, args...)
	}
	for _, j := range againChunks {
		args := chunks[j].Args()
		args[0], args[1] = "eval", refreshLocksSrc
		c := goredis.NewCmd(ctx, args...)
		c.SetFirstKeyPos(3)
		_ = pipe.Process(ctx, c)
		chunks[j] = c
	}
	sent = time.Now()
	_, _ = pipe.Exec(ctx)
	for _, i := range again {
		n, why, err := refreshAnswer(cmds[i])
		errs[i] = mine[i].refreshed(ctx, sent, px, n, why, err)
	}
	for _, j := range againChunks {
		refreshedChunk(ctx, chunks[j], chunkAt(locks, j), mine, errs, sent, px)
	}
	return errs
}

// chunkAt is the j-th chunk of locks, as RefreshBatch cut them.
func chunkAt(locks []int, j int) []int {
	return locks[j*refreshChunk : min((j+1)*refreshChunk, len(locks))]
}

// refreshLocksCmd is the call of refresh_locks.lua that extends the plain
// or fair locks mine[at...] by px milliseconds.
func (l *Locker) refreshLocksCmd(ctx context.Context, mine []*lease, at []int, px int64) *goredis.Cmd {
	// The keys, owners and tokens go in as pointers, which cost no
	// allocation as interface values (see plainContender.cmd).
	keys := make([]string, len(at))
	args := make([]any, 0, 4+3*len(at))
	args = append(args, "evalsha", l.s.refreshLocks.Hash(), len(at))
	for j, i := range at {
		keys[j] = lockKeyOf(mine[i].key)
		args = append(args, &keys[j])
	}
	args = append(args, px)
	for _, i := range at {
		args = append(args, &mine[i].owner, &mine[i].token)
	}
	c := goredis.NewCmd(ctx, args...)
	c.SetFirstKeyPos(3)
	return c
}

// refreshedChunk takes the answer of a call of refresh_locks.lua, sent at
// sent, for the leases mine[at...]: {day, one flag per lease, '1' or a
// letter for why not}.
func refreshedChunk(ctx context.Context, c *goredis.Cmd, at []int, mine []*lease, errs []error, sent time.Time, px int64) {
	v, err := c.Slice()
	var (
		day   int64
		flags string
	)
	if err == nil {
		ok := len(v) == 2
		if ok {
			day, ok = v[0].(int64)
		}
		if ok {
			flags, ok = v[1].(string)
		}
		if !ok || len(flags) != len(at) || day <= 0 {
			err = fmt.Errorf("%w: a batch refresh of %d locks answered %d values", driver.ErrUnavailable, len(at), len(v))
		}
	}
	for j, i := range at {
		var (
			n   int64
			why byte
		)
		if err == nil {
			why = flags[j]
			if why == '1' {
				n = day
			}
		}
		errs[i] = mine[i].refreshed(ctx, sent, px, n, why, err)
	}
}

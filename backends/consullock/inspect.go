package consullock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"unicode"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/guard/driver"
)

var (
	_ driver.Inspector     = (*Locker)(nil)
	_ driver.Lister        = (*Locker)(nil)
	_ driver.ForceReleaser = (*Locker)(nil)
)

// Inspect implements driver.Inspector with one consistent read of every key
// of the name: its lock key and fair queue, and its read/write lock's and
// semaphore's contender keys. The holders are the lock key's session, and
// the contenders their lock admits, as a contender would judge them
// (readers older than every writer, the oldest writer when no key is
// older, a semaphore's oldest permits); Waiters counts the queued waiters
// and the other contenders (a waiter is counted once it has queued, after
// its first attempt). Each holding is SessionBound, with
// TTL 0: it lives as long as the session that keeps it.
//
// With Consul's ACLs on, a read leaves out the keys its token may not
// read, and says only that it left some out (see readToken for the token
// the read carries): Inspect, and ForceRelease, then fail with an error
// wrapping driver.ErrUnavailable that says so, rather than see a name held
// by another token's session as free. List cannot tell which names it
// left out (see List).
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Inspection, error) {
	mine, err := l.keysOf(ctx, key)
	if err != nil {
		return driver.Inspection{}, err
	}
	holders, waiters := judge(key, mine)
	return driver.Inspection{Holders: holdings(holders), Waiters: waiters}, nil
}

// keysOf reads every key of the name key in one consistent read. Every key
// of the name starts with its escape and a '.'; so do the keys of names
// that continue it, which nameOf tells apart. A read from which the ACL
// left keys out fails: they may be the name's (or a name's that continues
// it, which the read cannot tell apart), and without them whether the name
// is held cannot be told.
//
// The keys of the name "." start with "..", which a URL cannot name (see
// tree): they are read as its lock key's, its read/write lock's and its
// semaphore's prefixes, which a URL can name, one consistent read each.
// Each of those locks is judged on its own keys alone.
func (l *Locker) keysOf(ctx context.Context, key string) ([]*api.KVPair, error) {
	if err := checkName(key); err != nil {
		return nil, err
	}
	prefixes := []string{url.PathEscape(key) + "."}
	if key == "." {
		prefixes = []string{LockKey(key), RWDir(key), SemaphoreDir(key)}
	}
	pairs, hiddenFrom, err := l.tree(ctx, prefixes...)
	if err != nil {
		return nil, err
	}
	if hiddenFrom != "" {
		return nil, withheld(key, hiddenFrom)
	}
	var mine []*api.KVPair
	for _, kv := range pairs {
		if name, ok := nameOf(kv.Key); ok && name == key {
			mine = append(mine, kv)
		}
	}
	return mine, nil
}

// withheld is the error of a name whose keys a read left out, hidden from
// the token hiddenFrom names (see whole).
func withheld(key, hiddenFrom string) error {
	return fmt.Errorf("%w: consul left out of the read keys that %s may not read, so whether %q is held cannot be told", errDenied, hiddenFrom, key)
}

// tree reads every key starting with each of prefixes, each the start of
// an escaped name (no '/' in it) or one of a name's prefixes, in one
// consistent read each, with the token such reads carry (see readToken).
// hiddenFrom names that token when the ACL left out keys it may not read
// (see whole), and is empty otherwise.
//
// A read names its prefix in the URL's path, which Consul's HTTP server
// cleans before it serves it: "." would read the whole store, and ".."
// would leave the KV API, whose 404 the client reads as no keys, as if the
// lock "." were free. Those two prefixes, which only List of the prefixes
// "." and ".." reads (keysOf reads the name "." otherwise), are read by
// dotTree.
func (l *Locker) tree(ctx context.Context, prefixes ...string) (pairs []*api.KVPair, hiddenFrom string, err error) {
	hiddenFrom, err = l.whole(ctx, func(secret string) (bool, error) {
		pairs = nil
		filtered := false
		for _, prefix := range prefixes {
			read := l.prefixTree
			if prefix == "." || prefix == ".." {
				read = l.dotTree
			}
			kvs, meta, err := read(ctx, prefix, secret)
			if err != nil {
				return false, err
			}
			pairs = append(pairs, kvs...)
			filtered = filtered || meta.ResultsFilteredByACLs
		}
		return filtered, nil
	})
	return pairs, hiddenFrom, err
}

// prefixTree reads every key starting with prefix, which a URL can name,
// in one consistent read, with the token secret.
func (l *Locker) prefixTree(ctx context.Context, prefix, secret string) ([]*api.KVPair, *api.QueryMeta, error) {
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	q := queryOpts(rctx)
	q.Token = secret
	kvs, meta, err := l.client.KV().List(prefix, q)
	return kvs, meta, l.fail(ctx, rctx, err)
}

// dotTree reads every key starting with prefix, "." or "..", which a URL
// cannot name (see tree). A transaction names its prefix in its body, and
// reads those keys alone, but it does not say when the ACL left keys out of
// its read, whatever its token; nor can the agent's answer that it has ACLs
// off be trusted for it, since servers with ACLs on filter the transactions
// of an agent with them off (the order in which ACLs are rolled out). So
// the transaction is followed by a listing of the whole store's key names,
// with the same token, which says so: the page costs the store's names, not
// its values, and a key the token may not read anywhere in the store makes
// it partial. A name under prefix that the listing shows and the
// transaction did not was made since, or hidden from the transaction, the
// token's rights widened since: it is read on its own (see dotKey), and the
// page is partial if that read is refused. A name that is no lock's key,
// or whose own read would go to another path (see servedAsIs), is not read:
// List leaves it out, and no lock's key is such. A hidden key deleted
// between the two reads goes unsaid, as it would in a read made after it.
func (l *Locker) dotTree(ctx context.Context, prefix, secret string) ([]*api.KVPair, *api.QueryMeta, error) {
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	q := queryOpts(rctx)
	q.Token = secret
	ok, resp, _, err := l.client.KV().Txn(api.KVTxnOps{{Verb: api.KVGetTree, Key: prefix}}, q)
	if err = l.fail(ctx, rctx, err); err != nil {
		return nil, nil, err
	}
	if !ok {
		var why []string
		for _, e := range resp.Errors {
			why = append(why, e.What)
		}
		return nil, nil, fmt.Errorf("%w: the read of %q: %s", errRefused, prefix, strings.Join(why, "; "))
	}
	kctx, kcancel := l.rctx(ctx)
	defer kcancel()
	q = q.WithContext(kctx)
	names, meta, err := l.client.KV().Keys("", "", q)
	if err = l.fail(ctx, kctx, err); err != nil {
		return nil, nil, err
	}
	read := make(map[string]bool, len(resp.Results))
	for _, kv := range resp.Results {
		read[kv.Key] = true
	}
	kvs := resp.Results
	for _, n := range names {
		if meta.ResultsFilteredByACLs || !strings.HasPrefix(n, prefix) || read[n] {
			continue
		}
		if _, ok := nameOf(n); !ok || !servedAsIs(n) {
			continue
		}
		// A name the transaction did not return: made since, or hidden
		// from it (the token's rights widened since). Its own read, which
		// names it in its path, tells: found, it is listed; gone, it was
		// deleted since; refused, the page is partial.
		kv, err := l.dotKey(ctx, n, secret)
		switch {
		case errors.Is(err, errDenied):
			meta.ResultsFilteredByACLs = true
		case err != nil:
			return nil, nil, err
		case kv != nil:
			kvs = append(kvs, kv)
		}
	}
	return kvs, meta, nil
}

// servedAsIs reports whether a read of the key k, which names it in the
// URL's path, reads k: Consul's HTTP server redirects a path with empty or
// dot segments to its cleaning, which is another key's, or another
// endpoint's, and refuses (400) one with a rune unicode.IsPrint is false
// for. The keys of a lock, whose name is escaped, have neither; another
// tool's may.
func servedAsIs(k string) bool {
	p := "/v1/kv/" + k
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean == p && !strings.ContainsFunc(k, func(r rune) bool { return !unicode.IsPrint(r) })
}

// dotKey reads the key k, under the prefix "." or "..", by the token
// secret: nil when there is none, errDenied when the token may not read
// it.
func (l *Locker) dotKey(ctx context.Context, k, secret string) (*api.KVPair, error) {
	rctx, cancel := l.rctx(ctx)
	defer cancel()
	q := queryOpts(rctx)
	q.Token = secret
	kv, _, err := l.client.KV().Get(k, q)
	if r := refusal(err); r != nil {
		return nil, r
	}
	return kv, l.fail(ctx, rctx, err)
}

// judge splits the keys of the name key into its holders, oldest grant
// first, and the number of its waiters.
func judge(key string, kvs []*api.KVPair) ([]*api.KVPair, int) {
	lk, rw, sem := LockKey(key), RWDir(key), SemaphoreDir(key)
	var holders, rwTree, semTree []*api.KVPair
	waiters := 0
	for _, kv := range kvs {
		switch {
		case kv.Key == lk:
			if kv.Session != "" {
				holders = append(holders, kv)
			}
		case strings.HasPrefix(kv.Key, queueDir(lk)):
			waiters++
		case strings.HasPrefix(kv.Key, rw):
			rwTree = append(rwTree, kv)
		case strings.HasPrefix(kv.Key, sem):
			semTree = append(semTree, kv)
		}
	}
	for _, c := range []struct {
		dir  string
		tree []*api.KVPair
	}{{rw, rwTree}, {sem, semTree}} {
		for _, kv := range c.tree {
			k, permits := contender(kv)
			if _, blocker := blocking(c.dir, kv.Key, c.tree, k, permits); blocker == nil {
				holders = append(holders, kv)
			} else {
				waiters++
			}
		}
	}
	slices.SortFunc(holders, func(a, b *api.KVPair) int { return cmp.Compare(a.ModifyIndex, b.ModifyIndex) })
	return holders, waiters
}

// holdings reports holder keys. A key's value is the label its holder
// acquired with (AcquireOptions.Owner), verbatim; its token is the key's
// ModifyIndex.
func holdings(kvs []*api.KVPair) []driver.Holding {
	if len(kvs) == 0 {
		return nil
	}
	hs := make([]driver.Holding, len(kvs))
	for i, kv := range kvs {
		hs[i] = driver.Holding{Owner: string(kv.Value), Token: kv.ModifyIndex, SessionBound: true}
	}
	return hs
}

// nameOf is the name whose key k is, if k is one of a name's keys: the
// canonical escape of a name followed by ".lock" (the lock key, and its
// queue under it), ".rw/" or ".sem/".
func nameOf(k string) (string, bool) {
	first, rest, nested := strings.Cut(k, "/")
	escaped, ok := strings.CutSuffix(first, ".lock")
	if !ok && nested && rest != "" {
		if escaped, ok = strings.CutSuffix(first, ".rw"); !ok {
			escaped, ok = strings.CutSuffix(first, ".sem")
		}
	}
	if !ok {
		return "", false
	}
	name, err := url.PathUnescape(escaped)
	if err != nil || url.PathEscape(name) != escaped {
		return "", false
	}
	return name, true
}

// List implements driver.Lister.
//
// Names are stored path-escaped, whose order is not the names' (an escape
// sorts apart from the byte it stands for), so Consul cannot start a page
// at a name. Each call therefore reads every key under the escaped prefix,
// in one consistent read, and keeps the limit smallest held names after
// after: its cost grows with the number of keys under prefix, not with
// limit.
//
// A name whose keys the token may not read is not listed: the ACL leaves
// them out of the read, and Consul says that it left some out, not which,
// so no entry with an Err can stand for them (Inspect of the name fails).
// The page is then returned with an error matching driver.ErrPartialList,
// and a name of which it holds a read/write lock's or a semaphore's keys
// is listed with an Err, as Inspect's: the keys left out may be some of
// its contenders, without which its holders cannot be told (a writer's
// key left out reads as its waiting reader holding). A name listed with
// its lock key's holder is right but for keys of its left out: its
// waiters may be more, and a read/write lock or semaphore of the same name
// may have holders the page does not show.
// Under the prefixes "." and "..", whose read lists the whole store's key
// names (see dotTree), a key the token may not read anywhere in it does
// so.
func (l *Locker) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: list limit %d", driver.ErrInvalidOption, limit)
	}
	if err := checkName(prefix); err != nil {
		return nil, err
	}
	pairs, hiddenFrom, err := l.tree(ctx, url.PathEscape(prefix))
	if err != nil {
		return nil, err
	}
	filtered := hiddenFrom != ""
	if filtered {
		err = fmt.Errorf("%w: consul left out of its read of %q keys that %s may not read", driver.ErrPartialList, url.PathEscape(prefix), hiddenFrom)
	}
	byName := map[string][]*api.KVPair{}
	for _, kv := range pairs {
		if name, ok := nameOf(kv.Key); ok && name > after && strings.HasPrefix(name, prefix) {
			byName[name] = append(byName[name], kv)
		}
	}
	var out []driver.Listed
	for name, kvs := range byName {
		if filtered && slices.ContainsFunc(kvs, func(kv *api.KVPair) bool { return !strings.HasPrefix(kv.Key, LockKey(name)) }) {
			out = append(out, driver.Listed{Key: name, Err: withheld(name, hiddenFrom)})
			continue
		}
		if holders, waiters := judge(name, kvs); len(holders) > 0 {
			out = append(out, driver.Listed{Key: name, Inspection: driver.Inspection{Holders: holdings(holders), Waiters: waiters}})
		}
	}
	slices.SortFunc(out, func(a, b driver.Listed) int { return strings.Compare(a.Key, b.Key) })
	return out[:min(limit, len(out))], err
}

// ForceRelease implements driver.ForceReleaser, for the lock of that name
// and its read/write lock's readers or writer and its semaphore's permits,
// as Inspect reports them. A holding's token is its key's ModifyIndex,
// which no other holding shares and which changes with every acquisition:
// the holdings target names are deleted in one transaction that checks each
// key's index (the label, the key's value, cannot change without it), so a
// holding that left after the read, and any later one, is never touched;
// when the transaction fails, the keys are read again and judged anew.
// Consul takes at most 128 operations in a transaction, 42 holdings: more
// (a semaphore's or a read lock's every holder, with target.AnyHolder) are
// removed by as many transactions as they need, each atomic, in order of
// grant. The next holder acquires a key at a later Raft index, so its token
// is greater than every token issued before.
//
// The same transaction acquires a marker under RevokedPrefix by each
// removed holder's own session, which that session watches with one
// blocking query: its lease, a driver.RevocableLease, reports the
// revocation (guard then cancels the holder's section) as soon as the
// query returns. Destroying the holder's session instead would also take
// every other lock that session holds, so ForceRelease does not.
func (l *Locker) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	var removed []driver.Holding
	for {
		mine, err := l.keysOf(ctx, key)
		if err != nil && removed == nil {
			// A read's, before any transaction that applied.
			return nil, driver.NotSent(err)
		}
		if err != nil {
			return removed, err
		}
		holders, _ := judge(key, mine)
		hs := holdings(holders)
		var targets []int // indexes in holders
		for i := range holders {
			if target.AnyHolder || target.Matches(hs[i]) {
				targets = append(targets, i)
			}
		}
		switch {
		case len(targets) == 0 && (removed != nil || len(holders) == 0):
			return removed, nil
		case len(targets) == 0:
			return nil, driver.HolderChanged(hs)
		}
		for len(targets) > 0 {
			batch := targets[:min(len(targets), maxForced)]
			ok, err := l.forceRemove(ctx, holders, batch)
			if err != nil && removed == nil {
				return nil, notSentOr(err)
			}
			if err != nil {
				return removed, err
			}
			if !ok {
				break // a holding left or changed: judged anew
			}
			for _, i := range batch {
				removed = append(removed, hs[i])
			}
			targets = targets[len(batch):]
		}
		if len(targets) == 0 {
			return removed, nil
		}
	}
}

// maxForced is how many holdings one transaction of ForceRelease removes
// at most: Consul refuses a transaction of more than 128 operations, and
// each holding takes 3.
const maxForced = 128 / 3

// forceRemove deletes the holders at the indexes batch, and acquires their
// markers, in one transaction that checks each key's index; it reports
// false when a check failed.
func (l *Locker) forceRemove(ctx context.Context, holders []*api.KVPair, batch []int) (bool, error) {
	var ops api.KVTxnOps
	var checks []int // the ops that check a holding's index
	for _, i := range batch {
		kv := holders[i]
		checks = append(checks, len(ops))
		ops = append(ops, release(kv.Key, kv.ModifyIndex)...)
		ops = append(ops, &api.KVTxnOp{Verb: api.KVLock, Key: marker(kv.Session, kv.Key, kv.CreateIndex), Session: kv.Session})
	}
	rctx, cancel := l.rctx(ctx)
	ok, resp, err := txn(rctx, l.client, ops)
	err = l.fail(ctx, rctx, err)
	cancel()
	if err != nil || ok {
		return ok, err
	}
	// A holding that left or changed since the read fails its check. A
	// transaction refused otherwise (an ACL that denies a delete or a
	// marker) would be refused again at every try.
	if !slices.ContainsFunc(resp.Errors, func(e *api.TxnError) bool { return slices.Contains(checks, e.OpIndex) }) {
		var why []string
		for _, e := range resp.Errors {
			why = append(why, e.What)
		}
		return false, fmt.Errorf("%w: the forced release: %s", errRefused, strings.Join(why, "; "))
	}
	return false, nil
}

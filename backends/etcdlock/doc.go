// Package etcdlock is a warden lock backend on etcd v3
// (go.etcd.io/etcd/client/v3): a driver.Locker for guard.New.
//
// # Sessions
//
// A Locker holds one etcd lease per TTL in use (in practice one per process,
// since guard uses one TTL): its session. Every lock the Locker holds is a key
// attached to that lease, so keeping any number of locks alive is one
// keepalive request per TTL/3 on one keepalive stream: the leases are
// driver.SessionLeases, guard sends nothing per lock for them, and no
// goroutine runs per held lock. The lease's TTL is counted by the etcd
// server; a lock is gone when the server expires or revokes the lease.
//
// etcd counts lease TTLs in whole seconds and cannot keep a lease shorter than
// about two election timeouts alive reliably, so the Locker declares (as a
// driver.Limiter) that TTLs are whole seconds, at least MinTTL; guard rejects
// any other TTL when it is configured rather than rounding it, since a TTL
// that silently grew would delay the takeover after a crash.
//
// Each keepalive request's send time bounds the server's expiry from below, so
// the session knows, by its own monotonic clock, the latest moment the lease is
// certainly alive: that is the session's Expiry. When no renewal has
// succeeded by a tenth of the TTL before that moment (the server is
// unreachable, the connection is cut), or the server says the lease is gone,
// the session is lost: its Done channel is closed before the server can grant
// the locks to anyone else. The next acquisition starts a new session; leases
// of the lost one stay lost.
//
// Lease.Refresh renews nothing (the keepalive does) and guard never calls it:
// for other callers it is a cheap ownership check, one read of the key.
//
// # Keys
//
// A lock named n lives under <escaped n>.lock/ (KeyDir; guard's prefix is
// part of n), where the name is path-escaped so that a '/' in it cannot nest one lock
// inside another. A contender puts <escaped n>.lock/<lease id in
// hex>-<sequence> in a transaction (readers of a read/write lock put it under
// <escaped n>.lock/r/), and the contenders are ordered by the keys' create
// revisions: the lowest holds. The fencing token is the holder's create
// revision, which increases across the whole cluster. Handoff is first come,
// first served, with or without AcquireOptions.Fair.
//
// A waiter watches only the deletion of the key just before its own, so a
// release wakes one waiter, not all of them. The watch is created at the
// server's current revision and the predecessor checked after it exists, so
// the server serves it from its synced watchers and the deletion arrives at
// once (client/v3/concurrency.Mutex watches from an older revision, which the
// server serves from the slower unsynced path, batched every 100 ms).
//
// Semaphore waiters are the exception: any release may admit any of them, so
// they watch the whole lock and count again on every deletion.
//
// Release deletes the key. Its name (the session's lease id and a sequence
// number of the Locker) is the session's alone, and in use by one
// contender at a time, so a stale or retried unlock never deletes another
// session's key. A session takes the same lock again with the same key,
// put again with a new create revision, once its previous holder's delete
// was answered and deleted it, so that no earlier delete of it can still
// land: etcd keeps every deleted key in its index until the cluster is
// compacted, and the read that comes with each acquisition visits them all,
// so a new key per acquisition would slow every acquisition of a lock down
// with the number taken since the last compaction (etcd compacts nothing
// by default). A key whose delete went unanswered, or that a forced release
// took, is not put again.
//
// A holder's session renews its lease, not its keys, so a key deleted by an
// operator (Locker.ForceRelease) would go unnoticed while the session lives.
// ForceRelease therefore also puts a marker under RevokedPrefix, on the
// holder's etcd lease, and every session keeps one watch on its own markers:
// the lease, a driver.RevocableLease, reports the revocation to guard, which
// cancels the section. That is one watch per session, not per lock. A
// session whose watch etcd refuses for want of rights on RevokedPrefix, at
// its start or whenever the watch is made again (after a move to another
// member), is given up as below, since a forced release of its locks would
// go unheard: its holders are told by its Done channel, requests on its
// leases and the next acquisition fail with etcd's refusal.
//
// # Failures
//
// The etcd client waits for a connection, and retries a lease grant, without
// limit; every request the Locker (and the Store) makes is therefore bounded
// by a request timeout of its own (WithRequestTimeout, default
// DefaultRequestTimeout). A request that gets no answer in time fails with an
// error wrapping driver.ErrUnavailable, unless the caller's context ended
// first, which is then reported as such. A waiting acquisition starts over
// after such a failure, with backoff, until its context is done. A request
// etcd refuses (for want of rights on the lock's keys, say), or that the
// client refuses to send (over its send limit: a lock name of some hundred
// KiB), fails with an error wrapping driver.ErrUnavailable that gives the
// reason; a waiting acquisition refused for want of rights, or for a
// request too large, fails at once, since it would be refused again. A
// refused put was not applied: it leaves no key behind, and the session's
// other locks are kept.
//
// The client balances its requests over every member, and a member whose
// process is frozen keeps its connection open while answering nothing, so
// the Locker sends its requests (and its keepalive stream and watches) to one
// member at a time, over connections of its own dialed with the client's
// settings: when a request there goes unanswered for 250 ms (or a keepalive
// stream does not open within as long: a frozen member the Locker has not
// connected to yet accepts the connection and never answers its
// handshake), or cannot reach it, the member is probed, and if it does not answer within 500 ms, or
// knows no leader, the Locker moves to the next member whose connection is
// not failing, and cuts short what it had sent to the one it left (a put so
// cut short gives up its session, as below, and is made again, even by an
// acquisition that does not wait). Requests that are safe to repeat (grants,
// revocations, releases, reads) are sent in attempts of a second at most,
// since a request sent during a leader election can be lost with its
// proposal and would otherwise wait for its whole timeout; the put of a
// contender's key is not repeated (see below).
//
// A key whose removal cannot be confirmed must not outlive the session TTL,
// or the lock would stay blocked for as long as the keepalive runs (after a
// leader election that swallowed a release, for instance). So the
// transaction that puts a contender's key runs to completion even when the
// caller's context is cancelled (Acquire returns the context's error at
// once, and the key is deleted in the background once the put is
// answered), because a put cancelled in flight could land after the delete
// meant to undo it; and whenever such a put, the delete of
// an abandoned attempt or a Release gets no answer, the session is given up:
// its keepalive stops, its Done channel closes, its lease is revoked best
// effort and otherwise expires with every key on it within its TTL. The other
// locks of that session are lost with it; later acquisitions start a new
// session. The revocation of a session that still holds locks waits a tenth
// of its TTL after Done closes, as long as the holders would have had to
// stop had the lease run out (unless the Locker is being closed).
package etcdlock

// Package etcd is a warden lock backend on etcd v3 (go.etcd.io/etcd/client/v3).
//
// # Sessions
//
// A Locker holds one etcd lease per TTL in use (in practice one per process,
// since guard uses one TTL): its session. Every lock the Locker holds is a key
// attached to that lease, so renewing any number of locks is one keepalive
// request per TTL/3 on one keepalive stream. The lease's TTL is counted by the
// etcd server; a lock is gone when the server expires or revokes the lease.
//
// etcd counts lease TTLs in whole seconds and cannot keep a lease shorter than
// about two election timeouts alive reliably, so AcquireOptions.TTL must be a
// whole number of seconds, at least MinTTL. Anything else is rejected with an
// error wrapping guard.ErrInvalidOption rather than silently rounded: a TTL
// that silently grew would delay the takeover after a crash.
//
// Each keepalive request's send time bounds the server's expiry from below, so
// the session knows, by its own monotonic clock, the latest moment the lease is
// certainly alive. When no renewal has succeeded by a tenth of the TTL before
// that moment (the server is unreachable, the connection is cut), or the
// server says the lease is gone, the session is lost: Done of every lease in it
// is closed before the server can grant the locks to anyone else. The next
// acquisition starts a new session; leases of the lost one stay lost.
//
// # Keys
//
// A lock named n lives under <prefix>/<escaped n>/, where the name is
// path-escaped so that a '/' in it cannot nest one lock inside another. A
// contender puts <prefix>/<n>/<lease id in hex>-<sequence> in a transaction
// (readers of a read/write lock put it under <prefix>/<n>/r/), and the
// contenders are ordered by the keys' create revisions: the lowest holds. The
// fencing token is the holder's create revision, which increases across the
// whole cluster. Handoff is first come, first served, with or without
// AcquireOptions.Fair.
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
// Release deletes the key only if it still has the lease's create revision, so
// a stale or retried unlock never deletes another holder's key.
//
// # Failures
//
// The transaction that puts a contender's key is never abandoned half way:
// it runs to completion even when the caller's context is cancelled (the key
// is then deleted before Acquire returns the context's error), because a put
// cancelled in flight could land after the delete meant to undo it and block
// the lock for as long as the session lives. When etcd does not answer it
// within the TTL, or the key of a cancelled waiter cannot be deleted, the
// session is given up instead, so that its lease expires and takes the key
// with it; the other locks of that session are then lost too.
package etcd

// Package idempotency makes a piece of work run at most once per key across
// processes, and answers its repeats with the stored result.
//
// A Store (the in-process MemoryStore here; Redis, SQL, etcd, ZooKeeper and
// Consul stores beside the lock backends) holds one record per (scope, key):
// claimed in progress by an owner token with a lease, or completed with the
// result kept for a retention. Every transition is one compare-and-set on
// the store's clock (Consul, which exposes none, keeps a claim's lease on the
// claiming process's clock with a session behind it: see consullock.Store),
// and completion is fenced by the owner token, so an owner whose lease ran
// out can never overwrite the record of the one that took over.
//
// A key whose work has started is never run a second time while its record
// lives: the Executor renews the claim until the work returns, whatever its
// caller does, and stores the result; a result too large to keep, or one the
// work says cannot be replayed, completes the key as executed, not
// replayable (ErrNotReplayable). Only a panic, or an error the ErrorPolicy
// releases, frees the key, and a crashed owner's claim after its lease.
//
// An Executor puts the protocol to work for callers outside HTTP (message
// consumers, "claim the red packet once per user"); httpmw.Idempotency does
// the same for HTTP requests. Every Store passes idempotency/storetest.
package idempotency

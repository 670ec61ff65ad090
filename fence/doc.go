// Package fence is the contract of warden's fenced writes: the storage half
// of a fencing token, which protects only the storage that checks it.
//
// Every lock warden grants carries a fencing token (guard.Lock.Token) greater
// than the token of every earlier holder of its key. A holder that paused past
// its lease (a garbage collection, a stalled VM) and wakes up still believing
// it holds the lock carries an older token than the holder that replaced it;
// storage that remembers the highest token it accepted can refuse the late
// write. The engines' fenced writes do so:
//
//   - redislock.Fence: Set, Del, HSet, IncrBy and Eval (the caller's own
//     script), each one Lua script that checks and advances the fence and
//     writes;
//   - etcdlock.Fence: a transaction builder whose Txn carries the fence's
//     compare and update beside the caller's comparisons and operations;
//   - zklock.Fence: a multi that checks the fence node's version and advances
//     its token beside the caller's operations;
//   - sqllock.Fence and the sqllock.Fenced gorm scope: the check inside the
//     caller's transaction;
//   - httpmw.Fence: a service's middleware that refuses a request carrying a
//     stale token, kept in any engine above through a Fencer.
//
// # The rule
//
// A fenced write names a resource and carries a token (a Claim). It is
// accepted when its token is at least the highest token the resource has
// accepted (equal: the same holder writing again), and refused otherwise
// with an error wrapping ErrStaleToken and guard.ErrLockLost. The check, the
// advance of the resource's highest token and the write are one atomic
// operation on the engine, so the highest token only grows and no write
// lands after a write with a higher token was accepted. A refused write
// changes nothing. Nor does a write the engine fails (a wrong type, a
// malformed request), its fence included, except where what was written
// cannot be undone and must stay fenced: redislock's Eval keeps the fence
// advanced when the caller's script fails after writing, and a SQL
// transaction committed after its write failed keeps its fence.
//
// # Resources
//
// A resource is the name under which an engine keeps one highest token:
// whatever the writes it fences must be ordered against. By default it is
// the lock's key as passed to guard.Lock or guard.Do (without the Guard's
// prefix), since the lock is what orders the writers; Claim.On names another
// one (several locks' writers fencing one table, one lock fencing several
// stores). Two resources are independent: a token accepted on one says
// nothing on the other. Each engine keeps a resource's token in a place of
// its own (a key, a node, a row) named from the resource; its documentation
// says where, and how to keep it beside the data (Redis Cluster's hash
// slots). That place is the fence's alone: a fenced write to its own
// resource's place is refused, but any other write that reaches it (a
// plain client's, or a fenced write of another resource that names it)
// can lower or remove the highest token, after which an older holder
// writes again. Keep data out of the engines' fence prefixes.
//
// # Reaching the token
//
// Code that has the *guard.Lock uses Of(l). Code that has only a context
// uses FromContext: the context fn gets from guard.Do (or Lock.Context)
// carries the lock, and a request served under httpmw.Fence carries the
// Claim its client sent (WithClaim). An http.Client whose transport is
// httpmw.FenceTransport stamps its requests with the Claim of their context,
// so a lock taken in one service fences the writes another makes. A Claim
// from a request is its client's word, not a lock's: a client that sends a
// made-up token far above the real ones advances the resource past every
// legitimate writer. httpmw.Fence says where to serve it, and how to reset
// a resource so advanced.
package fence

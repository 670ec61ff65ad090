// Package consullock is a warden lock backend on Consul
// (github.com/hashicorp/consul/api): a driver.Locker for guard.New.
//
// # Sessions
//
// A Locker holds one Consul session per TTL in use (in practice one per
// process, since guard uses one TTL). Every lock the Locker holds is a KV
// key acquired by that session, so keeping any number of locks alive is one
// renewal request per TTL/3: the leases are driver.SessionLeases, guard sends
// nothing per lock for them, and no goroutine runs per held lock.
//
// Consul accepts session TTLs from 10 s (its session_ttl_min) to 24 h, so
// the Locker declares them (as a driver.Limiter) and guard rejects any other
// TTL when it is configured: a Guard on Consul needs guard.WithTTL of 10 s
// or more. The server invalidates a session no sooner than its TTL after the
// last renewal it received, but may wait up to twice the TTL: a holder that
// crashes keeps its locks for between one and two TTLs. Each renewal's send
// time therefore bounds the server's expiry from below, and the session's
// Expiry is the send time of its last answered renewal plus the TTL. When no
// renewal has been answered by a tenth of the TTL before that moment, or the
// server no longer knows the session, the session is lost: its Done channel
// is closed, and every section it kept is cancelled at once. A session that
// the server ends (an operator destroys it) is found out within a round
// trip, not at the next renewal: the session holds an anchor key, deleted
// with it, under the directory its one blocking query watches (see
// Operators), and a renewal is sent as soon as the anchor goes. A session
// that a restored snapshot does not have is found out at its next renewal:
// Consul answers the query that a restore wakes with what it read before.
// The next acquisition creates a new session.
//
// The session is created with Behavior "delete", no health checks and a
// LockDelay of 0, none of which are Consul's defaults:
//
//   - Behavior "delete" deletes the keys a session holds when it ends,
//     where the default, "release", would leave them, unlocked, behind: a
//     lock key exists exactly while it is held, which is what an
//     acquisition checks (check-not-exists), and a crashed process leaves
//     nothing.
//   - Consul ties a session to the serfHealth check of the agent's node
//     unless told otherwise. That check follows the agent, not the process
//     holding the locks: it protects nothing the TTL does not (a process
//     that dies stops renewing), and it would end every session of an
//     agent whose node gossip marks failed for a moment while the holders
//     run on and renew, a loss of all their locks for nothing. Without
//     checks only the TTL or an explicit destroy ends the session.
//   - After a session is invalidated, Consul refuses for LockDelay (15 s by
//     default) to let another session acquire the keys it held, so that a
//     holder that has not yet noticed its loss stops first. Here the holder
//     notices before the server can act (its Expiry is earlier than any
//     server-side invalidation), and the fencing token protects storage from
//     one that does not, so the delay would only add 15 s to every takeover
//     after a crash. That holds for a session whose TTL runs out, not for
//     one an operator destroys: Consul deletes its keys at once and may
//     grant them to a waiter before the holder learns of the loss, a round
//     trip later (see below); only the fencing token then keeps the holder's
//     late writes out.
//
// # Keys and tokens
//
// The lock named n is the key <path-escaped n>.lock (LockKey; guard's prefix
// is part of n), so that a '/' in a name cannot nest one lock inside
// another. Its value is the holder's label (AcquireOptions.Owner). An
// acquisition is one transaction (/v1/txn): check that the key does not
// exist, acquire it by the session (the lock verb), and read it back. The
// fencing token is the key's ModifyIndex from that read: a Raft index,
// monotonic across the datacenter and across leader changes, obtained in the
// same round trip as the acquisition. Release deletes the key only if its
// ModifyIndex is still the token (check-index, then delete, in one
// transaction), so a stale or retried release
// never deletes a newer holder's key.
//
// # Waiting
//
// A waiter waits with blocking queries (?index=) on what blocks it, sent
// to the leader, each waiting up to a second there and bounded by that
// second, Consul's jitter of up to a sixteenth of it, and a grace: on a
// lock that stays held, a waiter thus sends one blocking query a second,
// answered when the second ends, or at once when the key changes. The wait
// is that short because the bound must outlast it, and a query that went
// to a leader that then froze gets no answer until the bound ends: a
// waiter should not sleep that long on a lock freed meanwhile. A query
// that gets no answer within the bound, or that fails, is followed at once
// by a consistent read, sent again until answered (as a release is, see
// Failures), so a waiter takes a lock freed meanwhile within about a
// second of Consul serving again.
//
// A waiter acquires a queue key of its own under <lock key>/, by its
// session, reading the lock key and the queue in the same transaction; the
// queue keys are ordered by CreateIndex, and each waiter blocks only on
// the key just before its own, from that key's ModifyIndex, so a release
// wakes one waiter (no herd, and no transaction that fails for every
// waiter but one). The first in the queue waits on the lock key, and
// acquires it while deleting its queue key in one transaction.
// Without AcquireOptions.Fair a waiter first tries the lock once, before it
// queues, so it may barge in ahead of the queue: a free lock costs one
// request, waited for or not. A fair acquisition that does not wait takes
// the lock if it is free, like any other. The first in the queue, when not
// fair, that loses an attempt to such a contender (most often a releaser
// asking again at once) yields to it for 30 ms after that loss, once in its
// turn at the head: it sleeps, sending nothing, then attempts at every
// release again. Every attempt is a write through Raft, one that fails
// costs the servers as much as one that succeeds, and a waiter that wins
// forces the releaser through the queue, a write more; yielding spares
// most of those lost races, and sleeping spares the blocking queries that
// watching a releaser's every acquisition and release would cost. The
// price is up to 30 ms more waiting for the head of the queue, during
// which the lock may stay free if the contender that won released it and
// nobody else came.
//
// # Read/write locks and semaphores
//
// A read/write lock's contenders, and a semaphore's, each acquire a key of
// their own by their session, under <escaped name>.rw/ (RWDir) or
// <escaped name>.sem/ (SemaphoreDir), reading the directory in the same
// transaction; the key's Flags say what it stands for (and a permit's
// number of permits), its value is the label, and the contenders are
// ordered by CreateIndex, as in Consul's semaphore recipe, but with no
// shared lock key to rewrite: a writer holds when no key is older, a reader
// when no writer's is, a permit when fewer than its permits are. A waiting
// reader or writer blocks on the latest key that blocks it; semaphore
// waiters block on the whole directory, since any release may admit any of
// them. The token is the contender key's ModifyIndex. An acquisition that
// does not wait and finds itself blocked deletes its key again: two
// requests. The transaction's read leaves out, without saying so, the keys
// Consul's ACL hides from the token, so an acquisition it finds unblocked
// reads the directory again, consistently, before it is granted (one more
// request), and is refused, with an error wrapping driver.ErrUnavailable
// that names the ACL, when Consul says that read left keys out (see ACLs
// for how Consul is made to say so): a key hidden from it may be a
// holder's. These keys are compatible with nothing but this package's own.
//
// # Operators
//
// Inspect, List and ForceRelease read every key of a name: its lock key,
// fair queue, and read/write and semaphore contenders, reported together. A
// holder renews its session, not its keys, so a key deleted by ForceRelease
// would go unnoticed while the session lives: ForceRelease therefore
// acquires, in the same transaction as its delete, a marker under
// RevokedPrefix by the holder's own session, and every session keeps one
// blocking query on its markers. The lease, a driver.RevocableLease, reports
// the revocation to guard, which cancels the section. A Locker's session
// sends that query again about every renewal period (its wait, with Consul's
// jitter and a grace, is bounded by TTL/3, or by 5 min 19 s for a TTL of 16
// min or more), so that a query whose connection died silently (a NAT or a
// proxy that drops an idle long poll without a reset) is given up, and the
// markers read on another connection, within a renewal period of a forced
// release, at a cost of about one request per renewal per session, whatever
// the number of its locks (two, and a new connection, when the answers come
// after the bound); a Store's session, which holds no locks, waits 5 min.
// Over HTTP/2 (Consul over TLS) the query shares its connection with the
// renewals, and a connection gone silent ends the session at its loss
// deadline, nine tenths of the TTL, instead.
//
// Consul's own tools go around that, and tell no holder:
//
//   - consul kv delete of a held key (or of a prefix over it) frees the
//     lock at once: another process may acquire it, with a greater token,
//     while its holder goes on until its release finds the key gone
//     (ErrNotHeld). ForceRelease (the warden CLI's release) is the way to
//     take a lock from its holder. A session's anchor deleted so is
//     acquired again within a round trip.
//   - consul kv put over a held key leaves it held by its session (Consul
//     keeps a key's session through a plain write) with a new ModifyIndex,
//     which Inspect reports as its token; its holder's release, which
//     tells the key apart by its CreateIndex and session, still deletes it.
//     The put sets the key's Flags to 0: a read/write lock's or semaphore's
//     key so written over still counts against every later contender, as a
//     writer's would.
//     A lock key written where no lock is held has no session: Inspect
//     reports the lock free, and the next acquisition takes the key, at
//     the cost of a read (as it does when another acquisition by the same
//     Locker holds the lock, which the transaction cannot tell apart).
//   - consul kv put -release -session=<id> (an unlock by the holder's
//     session id) leaves the key without a session, so the lock is free
//     while its holder goes on, as after a delete; when the holder's own
//     Locker takes the key again, the earlier lease is revoked (its section
//     cancelled) and its release leaves the later lease's key alone.
//   - consul snapshot restore puts every key back as the snapshot had it:
//     a lock acquired since is free while its holder goes on, unless its
//     session is younger than the snapshot (the session is then gone, and
//     its holders told at its next renewal), and a lock released since is
//     held again by its old session, which its Locker renews, until the
//     Locker is closed or ForceRelease removes it. Tokens still grow: the
//     Raft index goes on past a restore. Stop the processes that hold
//     locks (or close their Lockers) before restoring, and start them
//     again after: a lock acquired since the snapshot is free from the
//     moment of the restore, while its holder goes on, so closing them
//     afterwards leaves two holders in the meantime.
//   - Lock-delay: warden's sessions have none, so Consul never holds back
//     one of its keys after a session ends, unless another tool acquired
//     the key by a session of its own with one (Consul's default is 15 s):
//     until it ends, an acquisition that does not wait fails with an error
//     wrapping driver.ErrUnavailable that names the delay, and a waiting
//     one tries again with backoff, up to a second apart.
//
// # ACLs
//
// With Consul's ACLs on, a Locker's token needs session:write on the
// agent's node (session_prefix "" { policy = "write" } does), write on
// its locks' keys, which start with the path escape of guard's prefix
// (key_prefix "warden:" { policy = "write" } for guard's default prefix,
// key_prefix "jobs%2F" for guard.WithPrefix("jobs/")), and write on
// RevokedPrefix (key_prefix "warden/revoked/" { policy = "write" }), with
// no narrower rule under it: each session acquires a key there, its
// anchor, and reads (lists, under acl.enable_key_list_policy, which write
// allows) the markers of the forced releases of its locks there. Inspect
// and List need read on the locks' keys; ForceRelease needs write on them
// and on RevokedPrefix, where it writes the holder's marker, and no
// session rights. A Store's token needs write on its own prefix and
// session:write alone.
//
// A holder that cannot see its markers would not learn that ForceRelease
// took its lock, and would work on while another holds it, so it does not
// hold: a session whose anchor is refused is destroyed, and the acquisition
// fails with Consul's refusal. The anchor proves every marker of the
// session readable when it begins: a rule that hides a marker and not the
// anchor tells the two apart, so it names the session, whose id, in the
// anchor's key and at the start of every marker's, Consul has just made.
// Rules changed while the session lives (a narrower deny, the read or list
// on RevokedPrefix taken away) are found out at the session's first read of
// its markers by them: the session is given up, its other locks with it
// (their sections cancelled, their keys deleted), when Consul says it left
// keys out of that read (the X-Consul-Results-Filtered-By-ACLs header), or
// refuses (or does not grant) the anchor anew after leaving it out (an
// attempt that gets no answer is made again until one does). That read
// comes within a round trip of a forced release's marker, which wakes the
// session's query; Consul judges a query by the rules as they were when it
// came, so a marker written while the query waits under the old rules is
// seen. Consul says that it left keys out, not which: a filtered read that
// follows no write under the session's markers' directory since the last
// read not filtered (its index the same) can hide only keys already seen,
// and keeps the session, but one after any such write gives it up. A rule
// naming a marker already seen, which refuses its delete and hides it, thus
// gives the session up at the next marker of another of its locks, as a
// rule hiding a marker unseen would. A read that fails hides nothing (a
// marker stays until seen), and may fail for a moment only (a token a
// secondary datacenter's servers do not know yet, acl.down_policy, a 5xx
// during an election, a 429 of a rate limit on reads): it is sent again,
// and the session is given up when none has been answered by its loss
// deadline as of the first failure, at most nine tenths of the TTL after
// it; a read that finds the anchor gone likewise, since no marker is read
// until the anchor is acquired again and a read after that answered. A
// query cut after its wait (a proxy's response timeout, an agent's restart)
// is followed by a read answered at once, which costs a session whose
// markers are readable nothing. A holder whose reads fail for good (the
// list on RevokedPrefix taken away, under acl.enable_key_list_policy) thus
// works on for up to nine tenths of the TTL without learning of a forced
// release, as one whose reads a network fault cuts off does. The next
// acquisition creates a new session, which the new rules may refuse.
//
// A read/write lock's or a semaphore's grant, Inspect, List, ForceRelease
// and a Store's Purge decide only on reads that Consul says are whole: one
// from which the ACL left keys out (Consul says that it did, not which)
// fails with an error wrapping driver.ErrUnavailable for want of ACL
// rights (List returns its page with driver.ErrPartialList; a Store's
// calls wrap idempotency.ErrInvalid instead, see Store), rather than
// take a lock for free, or a record's chunks for no record's, for want of
// a key it was not shown. Consul says so only to a request that carries a
// token, and reads one that carries none (none of the client's own, and no
// default token of the agent's) as the anonymous token's, under either
// default policy, filtered without a word. Those reads therefore name
// their token: the one the client's requests carry, as token/self last
// answered, or the anonymous token, by its secret "anonymous", when they
// carry none Consul knows. For read/write locks and semaphores, then, a
// Locker's client needs:
//
//   - with ACLs off (whatever default_policy the agent's configuration
//     names): nothing. An agent with ACLs off says so without asking the
//     servers, which may have them on (they are turned on there first):
//     a Locker behind it reads with its client's own token, which such
//     servers judge as below; a client without a token is then not told
//     what they leave out;
//   - with ACLs on, under either default policy: read on every contender
//     key of the read/write locks and semaphores it takes, as write on its
//     locks' keys (above) gives, for the token its requests carry: its
//     own; the agent's default token, when it has none; else the anonymous
//     token, whose policies must then allow it (under the default policy
//     allow, an anonymous token without policies reads every key). While a
//     contender's key stands that a rule denies that token (an exact
//     key's, a narrower prefix's), a grant judged by it is refused, with an
//     error that names the token (the anonymous token, for a client
//     without one Consul knows).
//
// A Locker asks token/self for such a read when it has not in the last
// minute (one request; with ACLs off, at each such read, which the agent
// answers itself: one that comes back with them on is found out at once),
// and its reads carry the answer for that minute: a client that carries the
// agent's default token reads with the token the agent had when asked for
// up to a minute after the agent's token is replaced or cleared, reads that
// are whole or said not to be. A read refused because that token was
// deleted, or filtered as the anonymous token's (the agent's token set
// since), asks again at once, and is made again when the answer names
// another token. A client whose own token Consul does not know (deleted, or
// not yet replicated) has its writes refused, and these reads made as the
// anonymous token's. token/self goes to the servers: where they cannot
// answer it (a secondary datacenter that does not replicate tokens, its
// primary down), these reads fail.
//
// Consul says nothing of what it leaves out of a read without a token (the
// anonymous token's): a Locker whose client has no token learns of a
// hidden marker only when its anchor is hidden too (the read on
// RevokedPrefix taken away, or denied), not when a rule names a marker or
// a lock's markers. Give a Locker's client a token of its own.
//
// # Idempotency store
//
// NewStore returns an idempotency.Store on Consul KV, for
// idempotency.Executor, httpmw.Idempotency and the scheduler's slots: each
// claim is a key acquired by the Store's own session, every transition a
// transaction that checks the record's ModifyIndex. Consul has no key TTL
// and no clock a transaction can read, so a claim's lease is counted by the
// Store that made it, with the session as the backstop for a process that
// dies, and a completed record's retention by the hosts' clocks; see Store.
//
// # Failures
//
// The client's HTTP transport has no timeout of its own, so every request
// but the blocking queries is bounded by a request timeout
// (WithRequestTimeout, default DefaultRequestTimeout), and every blocking
// query by its wait time, Consul's jitter of up to a sixteenth of it, and a
// grace. A request that gets no answer in time fails with an error
// wrapping driver.ErrUnavailable, unless the caller's context ended first,
// except a waiter's blocking query, which is followed by a consistent
// read, sent again until answered (see Waiting).
// A waiting acquisition keeps its place through reads that fail (see
// Waiting), and starts over after any other such failure, with backoff,
// until its context is done. A request Consul refuses for good (a 4xx
// status but 408 and 429: a token without the rights, or one it does not
// know, a namespace on a Consul without Enterprise, a body over its
// limits.txn_max_req_len) fails at once, with an error wrapping
// driver.ErrUnavailable that gives Consul's reason: the same request would
// be refused again, and the refusal is never taken for a lock held by
// another. A waiter whose token is deleted while it waits fails so at its
// next read. A release refused so is sent again, as one that gets no answer
// is, until its session's loss deadline as of the refusal, when the session
// is given up, which deletes the key (and its other locks, which refused
// renewals would lose by then anyway): a refusal lasting a moment costs the
// session's other locks nothing, but a policy refusing one key for good
// costs them at that deadline (about nine tenths of the TTL after the
// refusal), and the refused key stays taken until then. A holder whose token
// is deleted, or loses session:write, has its renewals refused: its session
// is declared lost, and its sections cancelled, a tenth of the TTL before
// Consul may end the session, which then ends by its TTL (its destruction is
// refused too). A name whose escape is longer than 2048 bytes, which
// Consul's limits could refuse, is refused with driver.ErrInvalidKey.
//
// A release that gets no answer (a leader killed or frozen with it in
// flight) may or may not have been applied, and a key it missed would be
// kept by the session's renewal for as long as the session lives: it is
// sent again, checked on the key's ModifyIndex as before (so no send can
// delete a newer holder's key, and a key found gone or changed counts as
// released by an earlier send), at once when a send fails and every half
// second while none is answered (Consul holds a request that reaches it
// during a leader election, and may forward it to the new leader a second
// or more after that leader serves: a fresh one is forwarded at once), but
// no more than three outstanding at once (each holds a connection, and the
// agent refuses a client address more than 200 by default, its session
// renewals included), until Consul answers; Release waits for that no
// longer than its context, and the resend goes on in the background until
// Close. The session, with its other locks, lives on meanwhile, unless no
// send is answered by the session's loss deadline as of the first failure:
// at that moment the session would have been lost anyway had Consul
// answered nothing since, so it is given up then (see below), and the lock
// comes back no later than had its holder crashed.
//
// Each session keeps a blocking query open on its markers, and each waiter
// one on what blocks it, each on a connection of its own: a client whose
// transport allows fewer connections to the agent than those and one more
// (http.Transport.MaxConnsPerHost) has its renewals wait behind them, and
// its sessions are lost (with a limit of 1, within the TTL).
//
// Applications talk to their node's agent, which forwards each request to
// a server it picks. A server that freezes (a long pause, a stalled VM)
// keeps its connections open, and the agent goes on picking it until Serf
// declares it failed or a request to it times out
// (limits.rpc_client_timeout, 60 s by default). The bounds above free a
// waiter or a release from such a request, but the next may go to the same
// server, so after a leader election the lock comes back only once the
// agent stops picking the frozen one: in a datacenter that wants its locks
// back soon after an election, gossip declares a server failed before an
// election ends (gossip_lan's probe_interval and suspicion_mult), or the
// RPC timeout is short. The README's fault table says what each measured.
//
// A write that acquires a key runs to completion even when the caller's
// context is cancelled (the lock is then released before Acquire returns the
// context's error), and when such a write or the delete of an abandoned
// queue key gets no answer, the session is given up: its renewal stops,
// its Done channel closes and it is destroyed, best effort, with every key
// it holds; otherwise it expires within twice its TTL. Later acquisitions
// create a new session.
package consullock

// Package redlock is the warden lock backend on N independent Redis masters,
// by the RedLock algorithm as its author describes it, with fencing tokens
// added.
//
// # Algorithm
//
// Acquire asks every node in parallel to take its vote, the lock key (a
// random owner id and the vote's deadline on the node's clock), if it is
// free, each call bounded by a per-node timeout far below the TTL
// (WithNodeTimeout, default 200ms), so a node that is down or hangs costs at
// most that. The lock is acquired only when a majority granted it AND the
// time the round took leaves a positive validity:
//
//	validity = ttl - elapsed - drift,   drift = ttl*0.01 + 2ms
//
// On any failure the owner's votes are withdrawn from every node that may
// hold one: those that granted it and those whose answer was lost or late. A
// node that refused held another owner's vote, so the attempt's cannot be
// there. Every attempt has an owner id of its own, so a withdrawal still
// under way on a slow node never removes a later attempt's vote. Refresh
// (owner-checked: a script whose SET ... XX KEEPTTL GET writes the vote's new
// deadline, the key's expiry moving once a day at most; see Server commands)
// also needs a majority within the validity; Release is owner-checked. Both
// return once a majority has answered for them (or against them, when no
// majority is left to have), and the other nodes follow in the background,
// within the node timeout. Acquire waits for every node, or the timeout,
// though a majority's grants settle the lease: a lease handed out before a
// slow node's vote lands could be released before it lands, and its
// withdrawal would then have to wait for it (the next acquisition finding
// that node still held) or miss it (the vote left there for the TTL). A
// lease's Expiry is the start of the round that granted or last extended it
// plus ttl - drift, so guard cancels the section before the votes can have
// lapsed on any node.
//
// # Fencing tokens
//
// RedLock alone offers no fencing token, which is the heart of Martin
// Kleppmann's objection to it: a holder paused past its validity cannot tell
// that its lock is gone, so the storage it writes to must refuse it. Here each
// node keeps a fence counter in the vote's key, and a token is only handed
// out once it is recorded as the fence of a majority, never lowering a
// counter. Any two majorities share a node, so a later lease finds a fence at
// least as high as every earlier token, and tokens increase.
//
// Recording usually costs nothing extra: the acquiring round proposes a
// token, and a node that grants its vote also records the proposal when it
// is above the node's fence, in the same script. The Locker proposes the
// highest fence the nodes have reported to it, moved on by the local
// monotonic time elapsed since; fences follow the nodes' clocks (see below),
// so the proposal is usually ahead of them all. When fewer than a majority
// record it (the Locker's first round, a node ahead of the others), the
// token is one above the highest fence the granting nodes reported, written
// back to them, where the owner still holds the vote, in a second round
// before Acquire returns. A node does not record a proposal more than the
// node timeout ahead of its clock, so fences never run further ahead of the
// clocks than that while the clocks agree (see below).
//
// Mutual exclusion holds under an assumption the docs must state plainly:
// nodes keep their data. A node that restarts without persistence (or with
// fsync lagging, appendfsync everysec) forgets its votes; if enough do, two
// holders may overlap. Run the nodes with appendonly yes and appendfsync
// always, or keep a restarted node out of service for longer than the
// largest TTL (delayed restart). The Locker does not enforce the delay: a
// node restarted empty votes at once. So a rolling restart without
// persistence, one node after another with no delay, is enough: once a
// majority has restarted within one TTL, another process takes a lock its
// holder still holds (TestRollingRestartForgetsTheLock: 2 of 3 nodes
// restarted, a lock with a minute left taken again). A node whose
// maxmemory-policy evicts keys forgets votes the same way under memory
// pressure (every vote's key has an expiry, so volatile-* policies evict
// them too; TestEvictionLosesVotes: 95 to 100 of 100 held locks taken
// again, 2 of 3 nodes evicting): run the nodes with noeviction, or no
// maxmemory. The Locker does not check the policy. Votes lapse by each
// node's wall clock (TIME), as Redis's own expiries do: a node whose clock
// is stepped forward (an NTP step, a date set by hand) lapses them early by
// the step, which the drift allowance does not cover, so keep the nodes'
// clocks slewed, never stepped. Every Locker of a lock must be given the
// same nodes (servers and database numbers), in any order: a majority of
// three nodes and one of those three and two more can share no node, so
// while a deployment grows from three to five, one process may hold a lock
// on two of the three and another take it on the other three
// (TestLockersOnDifferentNodeSets). Nothing on the nodes can tell, each
// having seen one vote: stop every process on the old nodes before one
// starts on the new. The nodes must be independent masters. One server
// listed twice would count twice toward a majority: New refuses one client
// listed twice, and one server behind two clients (one address twice, two
// spellings of it such as 127.0.0.1 and localhost, two dialers of their
// own) is found by its run_id (INFO server), which the Locker reads from
// every node in one round on first use (an acquisition, a Ping) and again a
// minute later, or a second later while a node's is unknown: the
// acquisition and Ping then fail with driver.ErrInvalidOption naming the
// two addresses. A node whose run_id is unknown (no answer, no INFO in its
// ACL user's rights) has its vote not counted, nor renewed: it is withdrawn
// with the others'. The reads go to all the nodes at once, so that a
// restart, which changes the run_id, can make one server look like two only
// when it falls within a round, and until the next. An address that fails
// over onto another node's server between two reads (a virtual address
// moved to the wrong server) is counted twice until the next read, a minute
// at most: from then on an acquisition, a Ping and a lease's refresh fail
// (the lease is lost, so the work it guards is cancelled); a node's address
// should fail over to that node's own replica, which replicates
// asynchronously: promoted, it has forgotten the votes it had not received
// yet, as a node restarted without persistence has, and a majority failing
// over within a TTL may let two hold a lock. The Locker cannot tell a node
// that is another's replica, which refuses every vote (READONLY): the
// Locker then tolerates one node's failure fewer, and Ping, which asks for
// answers, not roles, does not tell.
// Tokens still grow when counters are lost: a node that votes takes the
// greater of its counter and its clock in microseconds as its fence, so a
// token issued after nodes forgot their counters is past every earlier one
// unless their clocks run behind by more than the time they were away, less
// the node timeout. That is what lets fenced storage refuse the stale
// holder of such an overlap, once the nodes were away for longer than the
// node timeout: tokens lead the clocks by up to that much (proposals above
// fences that other Lockers' proposals left; 74ms within 40s of 8
// contenders, on 4 Lockers, taking turns on five nodes with a 200ms node
// timeout), and a majority restarted empty faster than their lead issues
// tokens below the stale holder's (TestTokensAfterAQuickRestart). The same
// reasoning lets a node's fence expire a day after it was last written, so
// that lock names used once do not stay on the nodes for ever: a fence is
// never more than the node timeout ahead of its node's clock when written,
// so the clock alone is past it a day later, unless the node's clock was
// stepped back by nearly a day meanwhile, or the nodes' clocks disagree by
// a day or more: a token written back in a second round is one above the
// highest fence of its majority, so a node whose clock runs ahead carries
// the others' fences ahead of their clocks.
//
// # Server commands
//
// A node's vote is one string key, {<key>}:lock, holding its deadline, its
// fence, the day its key expires and the owner; a withdrawn vote stays,
// free, as the node's fence. A vote is the node's TIME and one SET ...
// KEEPTTL GET that writes the new state and reads the old one (written back
// when it was another owner's); a withdrawal is one SET ... XX KEEPTTL GET
// (XX: a node that lost the key is not given one back by a refresh or a
// withdrawal, which would have no expiry). An uncontended acquisition and
// release cost 5 commands a node (25 over five nodes, against 40 when the
// vote was a SET NX PX key beside a fence counter the vote read and
// wrote). The key expires at the end of the day after its
// last vote or refresh, so a fence still expires a day at least after it was
// last written. Nodes need Redis 6.2 or newer. Each key or argument a
// script is given costs a node about 1.3k instructions, the script itself
// about 13k, a SET 7k and TIME 8k: per node, an uncontended vote costs
// about 64k instructions and a withdrawal 38k (callgrind, Redis 7.0), most
// of it those. After an attempt that found the lock held, a waiter probes:
// it reads the nodes' states (a GET), writes nothing, and votes again only
// once a majority would grant its vote, reading each node's state before
// writing there. A probe judges whether a vote lapsed by the node's clock:
// read with the state (a TIME in the same round trip, where a script of
// its own cost 3 commands and several times a GET's instructions), then
// taken as read, moved on by the time elapsed here, for a second; only
// the pause and the decision to vote depend on it. A probe reads a
// majority of the nodes first, and the others only when some of those are
// free but not all: a lock held on all of the first settles it, which is
// the rule under contention. Among 64 contenders holding the lock 1ms on 5
// nodes, a probe cost 10 commands when it read every node's state and
// clock, and costs 4.3 on average reading a majority first and the clocks
// once a second (BenchmarkContended). A node that failed its last vote or
// probe is read first only when too few others are left: a silent one
// would hold each probe to the node timeout. A waiter voting on every
// attempt would write its vote on the nodes that are free while the lock
// is held on a majority, or while a holder's fresh attempt is on its way,
// then withdraw it: among 8 contenders holding the lock 1ms, such split
// votes came at 0.37 to 0.54 per acquisition, and at 0.01 to 0.03 with the
// probe.
//
// The per-node timeout is enforced by the Locker even when a client does not
// honour context deadlines (go-redis does only with ContextTimeoutEnabled);
// set ContextTimeoutEnabled on the clients so that a hung node's connection
// is also given back promptly. Every call also returns once its context is
// done, whatever the clients do, so the Locker declares
// driver.ContextBounded and guard calls it on the caller's goroutine. A
// failed attempt's votes are withdrawn all the same: the withdrawal goes on
// in the background, within the node timeout, and the attempt hands out no
// lease once its context is done. The Locker's next attempt on that lock
// waits for such withdrawals (or releases so cut short) to be over, within
// the node timeout, so that it does not find its own earlier votes and take
// the lock for held.
//
// # ACLs
//
// With Redis ACLs, the user needs EVALSHA and EVAL, every command the
// scripts run (GET, SET, DEL, TIME, PTTL, PEXPIREAT: a script's own calls
// are checked against the user's rights, and a node that refuses one
// inside a script is refused a vote for good, as one that refuses
// EVALSHA), INFO, for the run_id, PING for Ping, and the keys, which start
// with '{' (the hash tag): for guard's default prefix,
//
//	ACL SETUSER warden on >password ~{warden:* +evalsha +eval +get +set +del
//	  +time +pttl +pexpireat +info +ping
//
// Without PEXPIREAT, a vote or a refresh that moves its key's expiry to a
// later day (the first vote on a key, then one a day for a key in use) is
// refused from inside its script on Redis 7.0 ("The user executing the
// script can't run this command") and writes nothing; one on a key whose
// day a user with PEXPIREAT set is granted. Such a user's locks work until
// a key's day has to move: a lock held over a day's end then loses its
// renewal.
//
// A node that refuses INFO is refused a vote, as one that refuses EVALSHA:
// an acquisition whose majority refuses ends at once with ErrUnavailable
// and the servers' words (NOPERM).
//
// # Waiting
//
// A waiting Acquire retries with jittered pauses whose bound grows from 2ms
// to WithMaxBackoff (default 250ms) and stays there however long the wait
// (driver.Backoff), never longer than the holder's remaining TTL as the
// nodes report it. Nodes that fail do not end the wait: it goes on until
// its context is done, unless a majority refuses the vote, or the read of
// their state a waiter makes between votes, for good (an ACL without a
// command: see ACLs), which ends it at once, the lock held or not, with
// ErrUnavailable and the servers' words. Release notifications over N
// nodes' Pub/Sub are not used: the single-deployment backend (package
// github.com/warden-go/warden/backends/redislock) does that.
package redlock

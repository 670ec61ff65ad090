// Package redislock is the warden lock backend on Redis, through go-redis v9
// and any goredis.UniversalClient: a single server, a Sentinel-managed
// primary or a Cluster. See README.md beside this file for the design and
// its limits.
//
// Every operation is one round trip to the server that holds the key: a Lua
// script (sent by digest, in full only when the server answers NOSCRIPT) that
// checks and changes the lock atomically, with expiries counted by Redis
// (the server's TIME, and PX for a writer's key), never by the
// application's clock. Renewals of many held locks go in one pipeline
// (driver.BatchRefresher). All the keys of one lock share the hash tag
// {<key>}, so they live in one Cluster slot; <key> is the key as guard
// passes it, under guard's prefix ("warden:" by default):
//
//	{<key>}:lock              the state of the exclusive lock, which is
//	                          also its fence: lease deadline (server
//	                          clock), fencing token, waiter flag, owner
//	                          id; expires one to two days after the
//	                          key's last grant or refresh
//	{<key>}:fence             fencing counter of the read/write locks
//	                          and semaphores, expires a day after their
//	                          last grant
//	{<key>}:queue             fair waiters, oldest first (list)
//	{<key>}:queue:deadlines   each fair waiter's deadline (zset)
//	{<key>}:waiters           waiting non-fair contenders by deadline (zset)
//	{<key>}:readers           read leases by deadline (zset)
//	{<key>}:writer            the write lease: owner id, PX ttl
//	{<key>}:writers-waiting   waiting writers by deadline (zset)
//	{<key>}:permits           semaphore permits by deadline (zset)
//	{<key>}:released          Pub/Sub channel of releases (readers,
//	                          writers, semaphores)
//	warden:wake:<id>          Pub/Sub channel of one Locker's mutex
//	                          waiters, fair or not, named in their records
//
// '{', '}' and '%' in a key are percent-encoded so the hash tag stays whole.
//
// Every read that judges a lock or a token is the key's master's. A
// ClusterClient with ReadOnly set (as RouteByLatency, RouteRandomly and a
// FailoverClusterClient's routing options set it) sends the commands Redis
// flags read-only (GET, HGET, EVALSHA_RO) to a replica, which lags its
// master and may show a held lock free; Inspect, List, the Fence's
// Highest and the Store's Get send theirs on go-redis's client of the key's
// master (ClusterClient.MasterForKey) instead, between READWRITE and
// READONLY in one pipeline: a node the client's slot map still names the
// master after a failover made it a replica answers MOVED, and the map is
// reloaded, rather than answer from its own data (two commands more a
// read, no round trip more). While the key's slot moves, its master's ASK
// answer is followed. A FailoverClusterClient's slot map comes from
// Sentinel, whose nodes are no Cluster's: the read goes to the master
// Sentinel last named, as it is. The scripts run by EVALSHA (every write,
// ForceRelease) go to the master already.
//
// An exclusive lock is one key, read and written by every grant, refresh and
// release in a single SET ... KEEPTTL GET: an uncontended acquisition and
// release cost 5 server commands (the two scripts' EVALSHA, the grant's
// TIME and each one's SET), one more than a plain SET NX PX lock released
// by an owner-checked script (4), which draws no fencing token. A released
// lock keeps its key, free, with its last token: the key outlives the lock
// as its fence, and expires at the end of the day after the key's last
// grant or refresh (the expiry moves once a day for a key in constant use),
// so a free key costs one small key (about 100 bytes) for a day or two
// after its last use, and lock names taken from request data (per user, per
// order) are reclaimed by Redis itself, with no purge to run. Where even
// that many are too many, the remedy is fewer names (a key per shard of
// users rather than per user), not a shorter expiry: see below for what the
// day buys.
//
// # Handing the lock to a waiter
//
// A waiting contender of a plain lock records itself among the lock's
// waiters, with its TTL, and sleeps; a release that finds a live record
// grants the lock to that waiter in the same script (a token past the
// releaser's, a deadline of the server's clock plus the waiter's TTL) and
// tells it through its Locker's channel, so the lock reaches the waiter in
// the release's one round trip, with no attempt of its own, and the
// releaser, coming straight back, finds it held and waits its turn rather
// than taking it again ahead of the waiter it woke.
//
// Under contention that is 9 server commands an acquisition: the release,
// which looks for a waiter first when its own grant found some, and writes
// the grant over its state in one SET GET, checked after (the script, TIME,
// ZPOPMIN, SET, PUBLISH); and the releaser's refused attempt (the script,
// the state's GET, the record's ZADD, PTTL), and a PEXPIRE more when the
// grant took the last record, so that the records' key went with it (10
// with one waiter at a time). That attempt reads no TIME:
// the release answers the server's clock of its grant, and an attempt sent
// right after it (within a sixteenth of the waiter timeout) that finds the
// lock held by another until past that clock takes it for the server's. A
// lease that ran out since is then taken for held, which refuses a free
// lock, never grants a held one: the contender, told the lease had that
// little left, comes back when it would have run out; and its record lapses
// that much early.
//
// The waiter does not count its lease from the message, which comes after
// the server's clock started it, but from the send time of its own last
// attempt that the server answered with a refusal, when the grant came
// after that attempt ran: the server then keeps the lease at least that
// long. The grant's token tells: the refusal answers the holder's token,
// and a later grant's is past it (messages and attempts travel on different
// connections, so a grant made before the refusal, since taken away by an
// expiry or a forced release, can arrive after it: its token is not past
// the one the refusal found, and the waiter tries again instead). A waiter
// that sent no such attempt, or none within half its TTL (the server was
// out of reach since), or one under WithWaitReplicas, makes an attempt
// instead, which finds the lock its own and extends it (and waits for the
// replicas). The message can be lost: the waiter comes back within a
// quarter of its TTL, as it does for a lost wake-up, and finds the lock its
// own the same way. A waiter that dies while recorded can be handed the
// lock until its record lapses, a waiter timeout after its last renewal,
// and then holds it for its TTL at most, as a holder that died would: each
// waiter's death costs the lock at most one TTL, within a waiter timeout of
// it. So can a record that a failover to a replica brought back after the
// grant that let its waiter in was lost: it costs at most one TTL too,
// within a waiter timeout of the failover. A waiter that gives up takes its
// record out, so that no release hands it the lock afterwards, then
// releases what one handed it before.
//
// Fair waiters are not handed the lock for their TTL: a release reserves
// it for the head of the queue for a handoff window, and wakes it; the
// head claims it, which extends it to its TTL, and a head that does not,
// nor renews its place, is dropped once the window ends. Records of an
// earlier version, which say no TTL, are woken as before and keep their
// place, so that processes of both versions exclude each other during a
// rolling upgrade; a waiter of this version is woken by an earlier
// version's release as before.
//
// # What the fencing token guarantees
//
// Each grant's token is the greater of the last token plus one and the
// server's clock (TIME) in microseconds. The lock's state, which holds the
// token, is replicated asynchronously like every Redis write, so a failover
// to a replica that missed the latest grants, or a restart without
// persistence, loses it (and the lock with it: two holders may then
// overlap, which is what the token is for). The next grant starts again
// from the new server's clock, which is past every token issued before as
// long as that server's clock is not behind the old one's by more than the
// time from the last grant there to the first grant here (a failover takes
// seconds; keep the servers' clocks synchronized, as NTP does, well within
// that). On one server that keeps its clock, tokens grow whatever happens to
// its data. A clock stepped backwards by more than the gap between two
// grants is the one case where a token can repeat.
//
// The state's expiry, a day at least after the key's last grant, leans on
// the same clock: a token is never above the clock of its grant (a grant takes more
// than a microsecond), so the first grant after the fence expired, drawn
// from the clock alone, is past every token before it unless the server's
// clock was stepped back by more than a day meanwhile; across a restart or
// a failover, the assumption above holds as it did.
//
// # Resharding a Cluster
//
// A lock's keys share one slot, and Redis moves a slot's keys to another
// master (redis-cli --cluster reshard, rebalance, del-node) a few at a time,
// each whole with its expiry: the state, the token and the records move
// with the lock, and a script runs on the one node that has every key it
// names, never on a mix. While the slot is open, a script whose keys are
// split between the two nodes, or not all written (a free lock's records,
// a read/write lock's writer: mostly), is answered TRYAGAIN, having run
// nothing, and sent again, with pauses of up to 100ms, until the slot
// settles or its ctx ends (then it fails as unavailable); so are the
// Fence's writes. Most acquisitions and releases of the locks in a slot
// being moved wait for the move to end; renewals, and a plain lock's
// attempts that do not wait, which name one key, do not.
// Moved this way under load (TestReshardContention: six processes taking a
// plain, a fair, a read/write lock and a semaphore of two permits in turns,
// their slots moved a key at a time 20 times, onto a master added and off
// it before its removal), 8,000 to 61,000 grants a run (four runs) saw no
// overlap, no token that was not past the one before, and no fenced write
// refused. Move slots as redis-cli does, which settles a slot as soon as its
// keys are moved, and finish an interrupted reshard (redis-cli --cluster
// fix): a release that waits past guard's release timeout fails as
// unavailable, and its lock stays taken until its TTL ends. A client that
// follows no redirection (MaxRedirects -1) does not reach the moved keys of
// an open slot: its calls on them fail as unavailable until it settles.
//
// A master emptied and removed (del-node: forgotten by the others, reset)
// keeps the waiters' subscriptions made on it, and hears no release: the
// Locker's probe of its connection finds it deaf and replaces it (see the
// README: its waiter had the lock 2 s after the release, against 15 s, a
// quarter of its TTL, before). A client that still counts the removed
// master among its seeds may load its slot map from it, which serves
// nothing: its answer, "CLUSTERDOWN Hash slot not served", makes the
// client load the map again. The probe, after each silent second, is one
// PUBLISH on the Locker's channel from another master than the
// connection's, as on a single server it is one PING; a master that does
// not take it (paused) is passed over for another, so that a deaf
// connection is not kept for as long as that master is paused.
//
// Redis deletes a set or a list that a command empties, and on the source
// node of an open slot, a command of a script on a key the node no longer
// has fails the script there, after what it wrote (a script is not rolled
// back), with an error that is not retried. The releases name no set
// after emptying it (the last permit or read lease), or read it again by
// pcall (the last lapsed record of a waiter, the fair queue's dead heads),
// so that they answer what they did. A script that writes again to a key
// it emptied still fails so, and answers unavailable: a release that puts
// back the only record it took, having found the lock's state not as its
// grant left it; the acquisitions, whose failure a waiting one tries again
// and a cleanup follows, have not all been read for it.
//
// # Redis versions
//
// Redis 6.2 or newer: the state is swapped with SET ... KEEPTTL GET. On an
// older server every plain or fair lock operation fails with an error that
// says so. While processes of an earlier warden, which kept the lock as its
// owner id with PX and the fence beside it, share lock names with this one
// (a rolling upgrade), the two exclude each other: this version finds their
// lock held, and they find any name this version used in the last day or
// two held, whether it is or not, so they wait until they are upgraded. A
// rollback meets the same wait: stop this version's processes, then delete
// the names' {key}:lock keys (see the README). The free state ForceRelease
// leaves has, in its owner's place, '!forced:' and the token it removed, so
// that the removed holder's refused renewal says an operator took its lock
// rather than that it expired; its deadline is 0, as every free state's,
// and a process of an earlier version that keeps the state in this format
// reads it as free, takes the lock over it with the same next token, and
// finds no owner of its own there.
//
// # The server's memory policy and rights
//
// A lock is only as safe as its key. A server whose maxmemory-policy
// evicts keys (allkeys-*, and volatile-* as well: every key warden writes
// has an expiry) drops held locks under memory pressure, and another
// process then takes them while their holders still hold them, as after a
// restart without persistence: with allkeys-lru and a maxmemory of 4 MB,
// 20 MB of cache keys written beside 100 held locks had 96 to 100 of
// them taken again by another process, over the runs seen
// (TestEvictionLosesLocks).
// The tokens stay ahead, and each holder's next renewal fails with
// ErrNotHeld, which cancels its section, but the two overlap until then.
// The LFU policies and volatile-ttl pick by the data's use and expiry, not
// by what it is: they spare the locks only while other keys are colder or
// expire sooner. Give warden a server with maxmemory-policy noeviction (or
// no maxmemory); a database of its own on a shared server is not enough,
// since eviction picks from every database. There, a server out of memory
// refuses every acquisition, renewal and release with its OOM error
// (ErrUnavailable): a lease whose renewals it refuses until the lease runs
// out is lost with that error as the cause.
//
// With Redis ACLs, the user needs EVALSHA and EVAL, and on Redis 7
// EVALSHA_RO and EVAL_RO (Inspect, List and the Store's Get run their
// script read-only, so that a user allowed only to read the keys,
// %R~{warden:* or %R~warden:idem:*, may list or read records; Redis 6.2
// has neither, and its ACL SETUSER refuses a line that names them: leave
// them out there, where the script runs by EVALSHA), every command
// the scripts call (a script's own calls are checked against the user's
// rights), PING, SUBSCRIBE and UNSUBSCRIBE, SCAN and GET for List, the
// lock keys (which start with '{', the hash tag: a pattern ~{warden:* for
// guard's default prefix), the Fence's and the Store's keys (warden:fence:
// and warden:idem:) and the channels; under the default prefixes (see the
// README for what fails without each part; TestDocumentedACL proves it):
//
//	ACL SETUSER warden on >secret +evalsha +eval +evalsha_ro +eval_ro +ping
//	  +subscribe +unsubscribe +scan +get +set +del +exists +pexpire +pttl
//	  +time +publish +hget +hmget +hset +incrby +lindex +llen +lpop +lrange
//	  +lrem +rpush +zadd +zcard +zcount +zpopmin +zrange +zrangebyscore
//	  +zrem +zremrangebyscore +zscore ~{warden:* ~warden:fence:*
//	  ~warden:idem:* &warden:wake:* &{warden:*
//
// plus the keys the Fence's writes touch, which are the application's.
// Earlier versions also needed +pexpireat: drop it only once every process
// using the user runs this version, since an earlier one refused it leaves
// keys that never expire or that expire before their lease ends; a state so
// left is not repaired (see the README). On a Cluster, add +cluster|slots
// and +command, which a go-redis ClusterClient sends to load its slot map
// and its commands' key positions, and for a ClusterClient with ReadOnly
// set +readonly, which go-redis sends on each connection, +readwrite,
// without which every read on the master (see above) fails, and +asking,
// without which such a read waits a slot's move out. Under another prefix
// (guard.WithPrefix("app:")), ~{app:* and &{app:* take the place of
// ~{warden:* and &{warden:*, and on a Cluster ~{warden:wake:* stays: the
// notifier probes a waiter's subscription by a PUBLISH on its Locker's
// channel, or, when the connection carries only readers', writers' and
// semaphores' channels or the client knows no other master than the
// connection's, by a script on a key {warden:wake:<id>}, whatever the
// prefix, and, refused, falls back to a PING, which does not find out a
// subscription on a master removed from the cluster. A request the server
// refuses for good (NOPERM, a script's call refused, an unknown command
// such as an EVALSHA renamed away) fails at once with the server's words,
// in a waiting acquisition too, which tries again after failures that may
// pass (no answer, OOM, a failover, an authentication error, which a
// credentials provider of short-lived tokens mends). A user without the
// channels loses only the wake-ups: releases send them by pcall, so a
// refused message fails nothing the release wrote, and waiters whose
// subscription the server refused poll every eighth of a second instead
// (see the README).
package redislock

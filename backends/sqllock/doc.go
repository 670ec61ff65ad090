// Package sqllock is a warden lock backend on a SQL database through gorm:
// PostgreSQL, MySQL/MariaDB, and SQLite (github.com/glebarez/sqlite, pure Go).
// It is the classic database lock, with its well-known flaws fixed.
//
// # Leases
//
// A lock is a row of the lock table. Acquire inserts the row when it is
// absent, or takes it over when its lease has expired, in one statement, so
// concurrent contenders are serialised by the database's row lock and exactly
// one wins:
//
//	INSERT INTO warden_locks (name, owner, version, lock_until, locked_at)
//	VALUES (?, ?, <db now>, <db now> + ttl, <db now>)
//	ON CONFLICT (name) DO UPDATE SET owner = ...,
//	  version = GREATEST(version + 1, <db now>), ...
//	WHERE warden_locks.lock_until <= <db now>
//	RETURNING version
//
// (MySQL writes the same with ON DUPLICATE KEY UPDATE and IF().)
//
// Every instant is the DATABASE's clock, stored as integer microseconds since
// the Unix epoch, computed and compared inside the statement: application
// servers whose clocks disagree cannot break exclusion. On SQLite the
// database's clock is the clock of the host running the statement; processes
// sharing one SQLite file share a host anyway (WAL does not work over network
// file systems).
//
// The fencing token is the row's version: the database's now in
// microseconds when the row is inserted, and the greater of that and the
// last version plus one at each takeover. It only grows, while the row
// lives: Release moves lock_until back to locked_at, when its owner took
// the lock, and keeps the row, and an expired
// row is simply taken over by the next Acquire. So the table keeps a row
// per key ever locked; where keys come from request data, reclaim the rows
// of long-free keys with Locker.Purge. Purge deletes a row only once the
// clock has passed its version by its idle time (at least MinPurgeIdle), so
// that the key's next row, starting from the clock, gives greater tokens
// than the deleted one did, unless the database's clock steps back by more
// than that. The fence table keeps a row per resource fenced, which Purge
// leaves alone: deleting one would let a stale token write. Refresh and Release are owner-checked
// (WHERE name = ? AND owner = ? AND version = ? AND lock_until > <db now>);
// a refresh that matches no row means the lease is lost. The lease keeper
// renews many held locks with one UPDATE (RefreshBatch), and each lease's
// Expiry is the local send time of the statement that last set its
// lock_until, plus the TTL: the database ran it later, so the row lasts at
// least that long. Owner ids are
// host:pid:random plus a per-lease counter, so two processes never look alike
// and a lease never mistakes an older lease of the same Locker for itself.
//
// A renewal must be answered within about 57% of the TTL (it is sent a
// third of the TTL after the last, and a lease is given up a tenth of the
// TTL before it could expire), and the database spends some microseconds
// of CPU per row renewed (5 to 6 on PostgreSQL 15), so the TTL bounds how
// many locks one process can hold: on one 2-core machine running both
// the process and PostgreSQL, 100,000 locks with a 3 s TTL were mostly
// lost (the renewal took longer than 1.7 s), and with a 10 s TTL none were
// (make bench-peers -pairs postgres -scenarios renewal -ttl 10s).
//
// On pgx's database/sql driver (gorm.io/driver/postgres), every call
// returns once its context is done, which the Locker declares
// (driver.ContextBounded): guard then calls it on the caller's goroutine,
// not on one of its own per acquisition and release. On other drivers, or
// a *gorm.DB bound to a transaction, guard bounds the calls itself. This
// holds for pgx's default handling of a done context (a past deadline on
// the connection, which ends a read or write at once); a pool configured
// with a context watcher of its own (pgconn's BuildContextWatcherHandler,
// one that sends a cancel request and waits before cutting the
// connection, say) returns only after that handler's delays, which guard's
// bound then includes.
//
// Renewals take their connections from the pool that acquisitions use,
// and database/sql hands a freed connection to a waiting request picked
// at random, not to the oldest: while more calls wait for a connection
// than the pool holds, a renewal waits its turn among them. With
// connections kept open that costs little: a lease of 600ms TTL held for
// 3s was kept in 9 runs of 9 on PostgreSQL, with a pool of one connection
// and 4 or 16 Acquire calls waiting for other keys' locks, or of four and
// 64. With a ConnMaxLifetime so short that every statement dials a new
// connection (1ms; PostgreSQL's SCRAM login on a loaded 2-core machine),
// it was lost, its work cancelled in time, in 7 of 9 runs with 4 to 16
// waiters (and kept in 6 of 6 with none or one). Keep connections open,
// and size the pool above the number of Acquire calls that wait at once.
//
// # Waiting
//
// A waiting Acquire polls with jittered exponential backoff (WithMaxBackoff),
// never sleeping past the holder's recorded expiry, and goes on through
// database errors until its context is done, but for a lock table missing
// or lacking a column (Migrate not run, or another table of that name),
// and prepared statements lost by a pooler (Connection poolers, below),
// which it returns at once wrapping driver.ErrInvalidOption. Bound to the
// caller's transaction it returns any error at once (Fencing, below). It
// is not fair: Fair is refused with driver.ErrUnsupported.
//
// An attempt whose answer is lost (its context ended, or its connection
// broke, once it was sent) may still take the lock on the server: the
// database runs a statement its client abandoned, and pgx's cancel request
// may reach the server after the statement has committed. Such an attempt
// is followed, in the background, by a few owner-checked releases of the
// row over the next seconds, matching that attempt's owner value alone, so
// that the lock comes back within moments rather than after its TTL; the
// row's version is left as it is, so tokens go on growing. A caller that
// tries for the lock at once after cancelling a waiting Acquire may still
// find it taken by that attempt for those moments.
//
// On PostgreSQL a release that someone waits for also announces itself, so
// that the waiter learns of it at once rather than at its next poll. A
// waiter that listens (below) marks the lock's row as waited for, until
// twice its next pause from then, in each attempt after its first (which
// is as short as an uncontended one), by the statement that finds the lock
// held, under the row lock that orders it with the release: a release that
// commits later sees the mark, and one that committed before left the lock
// free for that statement to take. An attempt that finds in its snapshot
// the lease unexpired and a mark that lasts its pause already, committed
// before it began and so seen by any later release, leaves the row alone
// and does not wait for its lock. A waiter whose pause ended without a
// notification, the lock most likely held still, reads the row first
// with a plain SELECT, and only when the mark there is too short marks it
// with an UPDATE of a lease still held; when the lease has ended, or the
// UPDATE finds it ended, it makes the attempt that can take the lock. The
// two plain statements cost the server less than that attempt, whose
// executor it sets up anew at every run (PostgreSQL 15: 50k and 98k
// instructions against 167k-207k). The releasing statement calls pg_notify
// on a channel named after the lock table, with the lock name as payload,
// only when the mark outlasted the moment the releaser took the lock (so
// also for a mark that ended during the hold, sending a notification that
// may wake no one; it needs no clock read): a NOTIFY, even one nobody listens to,
// serialises the commits of every notifying transaction on the server, so
// releases nobody waits for send none. The mark outlives the last waiter
// by up to twice its longest pause (WithMaxBackoff), and its releases
// notify meanwhile. Being part of the release's transaction, the
// notification is delivered only if the release committed. With a Listener
// (WithListener(pglisten.Listener{})), while any of its Acquire calls waits,
// a Locker keeps one connection out of the pool LISTENing on that
// channel (size the pool for it; a pool limited to one connection is left
// alone and its waiters poll). A notification wakes one local waiter of that
// name, the longest waiting, not all of them: only one could win the lock, and
// the others keep their backoff timers and are woken by the next release. The
// listener stops a few seconds after the last waiter leaves, or on
// Locker.Close.
//
// While its listener runs (it had waiters in the last few seconds) a Locker
// announces its releases that were waited for a millisecond late instead,
// by a statement of their own, and not at all when an attempt of its own
// finds the lock taken again before then (by itself, asking again at once,
// or by another process, whose release is announced in its turn: the mark
// stays on the row through grants). A worker looping on a hot key then takes
// it back without waking every listening process in vain: each would run an
// attempt bound to fail, and every notification wakes every listening session
// of the database. An attempt of its own under way when the millisecond ends
// (on a loaded database one can take longer) is waited for, up to twenty
// milliseconds in all. A handoff to another process waits that millisecond
// more.
// Close sends the announcements still pending.
//
// Notifications only shorten pauses; polling stays the rule. A lost
// notification, a listener that fails (it reconnects with backoff), or a
// holder that died (no release, so no notification) costs a waiter at most
// one backoff pause. Each time
// the listener starts listening it wakes every local waiter once, since
// releases committed before then were not heard. pglisten's Listener needs
// gorm's postgres driver on pgx (its default); on any other driver, or
// without a Listener, waiters poll. The Listener lives in its own package so
// that programs on MySQL or SQLite do not link pgx. WithoutNotify turns the
// whole mechanism off. MySQL and SQLite always poll.
//
// # Connection poolers
//
// Behind PgBouncer in session pooling mode the package works as on a
// direct connection. In transaction pooling mode (each transaction, and so
// each of the package's statements, on whichever server connection is
// free), two things of a session do not carry over:
//
//   - pgx's prepared statements (its default statement cache) and gorm's
//     PrepareStmt, which name a statement on one server connection and run it
//     by that name later, on another: PgBouncer before 1.21, or with
//     max_prepared_statements = 0, lets the server refuse it (SQLSTATE
//     26000 or 42P05) on statements at random. A statement so refused
//     runs again once at once, which mends what pgx's cache alone caused
//     (an application's DEALLOCATE ALL: pgx prepares the statement again),
//     but not what gorm's PrepareStmt caused, pooler or not: gorm keeps
//     the statement, dead on its connection, so that after a DEALLOCATE
//     ALL every Refresh and RefreshBatch run there is refused. Refused
//     twice, a statement is reported wrapping driver.ErrInvalidOption,
//     naming the fix, not as the database being unavailable: a waiting
//     Acquire returns it at once rather than retry until its deadline. A
//     lease keeper retries a renewal so refused, as any error but
//     driver.ErrNotHeld, until the lease's loss deadline, and loses the
//     lease if every renewal until then is refused. Add
//     default_query_exec_mode=exec to the DSN (or set PreferSimpleProtocol
//     in gorm's postgres.Config), and leave PrepareStmt off.
//   - LISTEN: the listener's server connection goes back to the pool, so
//     its notifications reach no one, and waiters learn of a release at
//     their next poll (WithMaxBackoff, 250ms by default, later). Leave the
//     Listener out there: its waiters' marks would only make releases send
//     notifications that no one hears.
//
// The package sets nothing on a session, so nothing else depends on it.
//
// # Replicas
//
// Every statement goes to the primary: those of a lock's life go to the
// *gorm.DB's own connection pool, bypassing gorm, and the others (batch
// renewals, inspection, Purge, the idempotency Store) carry the setting
// by which gorm's dbresolver plugin sends a statement to its sources, so
// that a resolver that sends reads to a replica does not send them there.
// A replica that lags would answer an owner check with the row as it was:
// on MySQL, where a renewal that changed no row is checked by a SELECT, a
// lease force-released and taken by another process was renewed all the
// same, and a Store could not read back the claim it had just written.
// New refuses (ErrInvalidOption) a *gorm.DB on which gorm sends the lock
// table's statements to another connection pool than its own, as
// dbresolver registered with Sources does: the lock's life would be in one
// database and its batch renewals in another, and every lease lost at its
// first batch renewal. Register the resolver with Replicas alone (its
// sources are then the *gorm.DB's own pool), or give New a *gorm.DB opened
// on the primary without it. A Store sends all its statements through
// gorm, so to the resolver's sources, all in one database.
//
// # No session locks
//
// Database session locks (pg_advisory_lock, GET_LOCK) are not offered: the
// database frees one the moment its connection drops, a partition or a
// proxy restart included, and the holder learns of it only when it next
// asks. No expiry can be computed ahead of that, so the section could not be
// cancelled before another process takes the lock. Leases can: their end is
// written in the row.
//
// # Fencing
//
// Fence, called inside the caller's own transaction before its writes,
// refuses the transaction when a newer token has already written the same
// resource, so a holder that paused past its lease cannot overwrite the newer
// holder's data.
//
// The package's own statements run again when PostgreSQL refuses them for
// a row updated since their snapshot (SQLSTATE 40001, under a
// default_transaction_isolation of REPEATABLE READ or SERIALIZABLE), and
// when a database picks them as a deadlock's victim; Fence, in the
// caller's transaction, cannot: its error wraps the database's, which the
// caller retries as it retries that transaction. Nor can a Locker or a
// Store on a *gorm.DB bound to the caller's transaction, which the
// database aborted with the statement: they too leave the retry to the
// caller and return the database's error, and a waiting Acquire returns
// any error at once rather than try again in the aborted transaction
// (which PostgreSQL refuses, 25P02) until its context ends.
//
// Leases and tokens are only as durable as the database's commits. A
// PostgreSQL running with synchronous_commit=off (or MySQL with
// innodb_flush_log_at_trx_commit other than 1) that crashes forgets its
// latest commits: a lease it granted may vanish while its holder works on,
// and the lock's version, which is the token, may be issued again. Run the
// lock table on a database that commits durably, as it does by default.
//
// Every statement must commit on its own. A MySQL session with autocommit
// off (autocommit=0 in the DSN, or the server's default) would leave each
// acquisition and release in a transaction nothing commits, undone when
// the connection closes: Migrate refuses such a pool. On MySQL the tables
// must be on a transactional engine, on which a statement refused midway
// (as by a trigger) has written nothing: Migrate makes them InnoDB
// whatever the server's default engine, and refuses a table of another
// engine (MyISAM, Aria, MEMORY), to be converted with ALTER TABLE ...
// ENGINE=InnoDB. PostgreSQL and SQLite have no such settings.
//
// # Tables
//
// Locker.Migrate creates the tables with gorm's AutoMigrate. To create them
// with your own migrations instead, this is the DDL (PostgreSQL and SQLite):
//
//	CREATE TABLE warden_locks (
//		name       varchar(255) NOT NULL PRIMARY KEY,
//		owner      varchar(255) NOT NULL,
//		version    bigint       NOT NULL, -- the fencing token
//		lock_until bigint       NOT NULL, -- lease end, µs since the epoch, database clock
//		locked_at  bigint       NOT NULL, -- when this owner took it, same unit
//		waiting_until bigint    NOT NULL DEFAULT 0 -- until when a waiter listens for its release, same unit
//	) WITH (fillfactor = 50); -- PostgreSQL: room in each page for HOT updates
//	CREATE TABLE warden_fences (
//		resource varchar(255) NOT NULL PRIMARY KEY,
//		token    bigint       NOT NULL -- highest token that wrote the resource
//	);
//
// On MySQL and MariaDB, name and resource are varbinary(255) instead, and
// the tables ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin.
// Keys are bytes, and must compare as bytes: every text collation there
// ignores trailing spaces (PAD SPACE, utf8mb4_bin included) or letter case,
// which would make "k" and "k " (or "k" and "K") one lock, whose Inspect,
// ForceRelease and Fence then reach the other key's holder or token. Tables
// made by earlier versions, with varchar key columns, are converted by
// Migrate; with your own migrations, run
//
//	ALTER TABLE warden_locks MODIFY name varbinary(255) NOT NULL;
//	ALTER TABLE warden_fences MODIFY resource varbinary(255) NOT NULL;
//
// The table takes names of at most 255 bytes, guard's prefix included;
// guard refuses keys over guard.MaxKeyLen (200 bytes) before they reach it,
// and the Locker a longer name with driver.ErrInvalidKey.
//
// Lock tables made by earlier versions have no waiting_until column, which
// only PostgreSQL's statements use: Migrate adds it, or run
//
//	ALTER TABLE warden_locks ADD COLUMN waiting_until bigint NOT NULL DEFAULT 0;
//
// before this version starts on PostgreSQL. Without it a release there
// falls back to the statement without the column (sending no
// notification), but the attempt of a waiter that listens fails with an
// error wrapping driver.ErrInvalidOption that names the column and the
// fix. With a constant default, the column is added without rewriting the
// table (PostgreSQL 11, MySQL 8.0.12, MariaDB 10.3 and later; earlier
// versions add it by rebuilding the table). Processes of
// the earlier version keep working on the migrated table beside this
// version's, but during such a rolling upgrade they do not mark the locks
// they wait for, so a release by this version reaches them at their next
// poll (at most WithMaxBackoff, 250ms by default, later), not at once.
//
// # SQLite
//
// Open the file with WAL and a busy timeout, so that several connections and
// processes can share it and a writer waits for the file lock instead of
// failing:
//
//	sqlite.Open("locks.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
//
// An in-memory database (":memory:") is one per connection of the pool:
// locks taken on one connection are not seen on another. Migrate refuses
// it, with driver.ErrInvalidOption, unless the pool is limited to one
// connection (SetMaxOpenConns(1)) or the dialector's DSN opens the
// database shared (file:name?mode=memory&cache=shared) as SQLite reads it
// (of a repeated cache parameter the last counts, and nothing after a
// '#'): SQLite is asked, by attaching the DSN on the connection, which it
// refuses for a shared database the connection has already. Only a URI
// that SQLite opens in memory is attached (its last mode parameter is
// memory, or its path :memory:; one with a '%' is not read), so that the
// check creates no file; a pool it refuses is left without a table. A dialector
// that wraps the SQLite one by embedding it is read through. Before, a
// Migrate that ran on a second connection made a second lock table there,
// and a lock was granted on both. A table that names its schema (main.locks) is
// checked in that schema: a temporary or attached in-memory one is one per
// connection too, as is a database the dialector was given as a Conn,
// whatever DSN it has besides (gorm does not open that one).
package sqllock

// Package redislock is the warden lock backend on Redis, through go-redis v9
// and any goredis.UniversalClient: a single server, a Sentinel-managed
// primary or a Cluster. See README.md beside this file for the design and
// its limits.
//
// Every operation is one round trip to the server that holds the key: a Lua
// script (sent by digest, in full only when the server answers NOSCRIPT) that
// checks and changes the lock atomically, with expiries counted by Redis
// (PX, and the server's TIME for leases kept in sorted sets), never by the
// application's clock. Renewals of many held locks go in one pipeline
// (driver.BatchRefresher). All the keys of one lock share the hash tag
// {<key>}, so they live in one Cluster slot; <key> is the key as guard
// passes it, under guard's prefix ("warden:" by default):
//
//	{<key>}:lock              the exclusive lock: owner id, PX ttl
//	{<key>}:fence             fencing counter, never expires
//	{<key>}:queue             fair waiters, oldest first (list)
//	{<key>}:queue:deadlines   each fair waiter's deadline (zset)
//	{<key>}:readers           read leases by deadline (zset)
//	{<key>}:writer            the write lease: owner id, PX ttl
//	{<key>}:writers-waiting   waiting writers by deadline (zset)
//	{<key>}:permits           semaphore permits by deadline (zset)
//	{<key>}:released          Pub/Sub channel of releases
//
// '{', '}' and '%' in a key are percent-encoded so the hash tag stays whole.
// The fence counter is the only key that never expires: its cost is one
// small key per lock name ever used, the price of tokens that never go back.
// It is replicated asynchronously like every Redis write, so a failover to a
// replica that missed it, or a restart without persistence, can issue a
// token again: the fence is as durable as the deployment's data.
package redislock

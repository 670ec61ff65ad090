// Package redis is the warden lock backend on Redis, through go-redis v9 and
// any goredis.UniversalClient: a single server, a Sentinel-managed primary or
// a Cluster. See README.md beside this file for the design and its limits.
//
// Every operation is one round trip to the server that holds the key: a Lua
// script (sent by digest, in full only when the server answers NOSCRIPT) that
// checks and changes the lock atomically, with expiries counted by Redis
// (PX, and the server's TIME for leases kept in sorted sets), never by the
// application's clock. All the keys of one lock share the hash tag {<key>},
// so they live in one Cluster slot:
//
//	<prefix>{<key>}:lock              the exclusive lock: owner id, PX ttl
//	<prefix>{<key>}:fence             fencing counter, never expires
//	<prefix>{<key>}:queue             fair waiters, oldest first (list)
//	<prefix>{<key>}:queue:deadlines   each fair waiter's deadline (zset)
//	<prefix>{<key>}:readers           read leases by deadline (zset)
//	<prefix>{<key>}:writer            the write lease: owner id, PX ttl
//	<prefix>{<key>}:writers-waiting   waiting writers by deadline (zset)
//	<prefix>{<key>}:permits           semaphore permits by deadline (zset)
//	<prefix>{<key>}:released          Pub/Sub channel of releases
//
// '{', '}' and '%' in a key are percent-encoded so the hash tag stays whole.
// The fence counter is the only key that never expires: its cost is one
// small key per lock name ever used, the price of tokens that never go back.
package redis

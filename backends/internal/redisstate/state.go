// Package redisstate holds the Lua helpers shared by the Redis and RedLock
// backends' scripts that keep a lock's state in one string key, swapped with
// SET ... KEEPTTL GET (Redis 6.2 or newer), so that an acquisition reads the
// old state and writes the new one in one command. The scripts every
// acquisition runs (grant, release, refresh) do without them: each helper
// is a closure made on every run of the script it is prepended to, which the
// server pays for on its one thread.
package redisstate

import _ "embed"

// Lua defines clock, fmt, day_of, put and put_day for the scripts it is
// prepended to.
//
//go:embed state.lua
var Lua string

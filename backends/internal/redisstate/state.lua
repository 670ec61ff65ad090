-- Helpers of the scripts that keep a lock's state in one string key that
-- outlives the lock as its fence, swapped in a single SET ... KEEPTTL GET
-- (redislock's plain and fair locks, redlock's votes). Each backend's own
-- state.lua, after this, says what the state holds.
local day_ms = 86400000

-- clock returns the server's time in microseconds and in milliseconds.
local function clock()
  local t = redis.call('time')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return us, math.floor(us / 1000)
end

-- fmt writes an integer held in a Lua number (exact up to 2^53) in full.
local function fmt(n)
  return string.format('%.0f', n)
end

-- day_of is the day (since the epoch) at whose end the key of a lease ending
-- at deadline may expire: the next day's end, so at least a day after it.
local function day_of(deadline)
  return fmt(math.floor(deadline / day_ms) + 2)
end

local function put(key, v)
  redis.call('set', key, v, 'KEEPTTL')
end

-- put_day writes v, a state whose key must last until the end of day, over
-- a key set to expire at the end of old_day (nil for a key that is gone):
-- with its expiry kept when that is late enough, else in the same SET with
-- the new one, which moves once a day for a key in constant use. A
-- PEXPIREAT after the SET, refused (an ACL user without it), would stop
-- the script with the state's new day and the key's old expiry (none, for
-- a key that was gone), and the next writer, finding the day, would not
-- move it.
local function put_day(key, v, old_day, day)
  if old_day and tonumber(old_day) >= tonumber(day) then
    put(key, v)
  else
    redis.call('set', key, v, 'PXAT', tonumber(day) * day_ms)
  end
end

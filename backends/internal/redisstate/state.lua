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

-- keep makes the key expire at the end of day, when it was set to expire
-- earlier (or not at all: a key a SET just created). It moves once a day for a
-- key in constant use.
local function keep(key, old_day, day)
  if not old_day or tonumber(old_day) < tonumber(day) then
    redis.call('pexpireat', key, tonumber(day) * day_ms)
  end
end

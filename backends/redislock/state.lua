-- The state of a plain or fair lock is one string key, {<key>}:lock, that
-- outlives the lock as its fence:
--   '<deadline>:<token>:<day>:<waiting>:<owner>'
-- deadline: when the lease ends, in ms on the server's clock (0 once
-- released); token: the fencing token of the latest grant; day: the day
-- (since the epoch) at whose end the key expires, at least a day after the
-- deadline; waiting: '1' once a waiter announced itself, which is what makes
-- a release look for one; owner: the holder's id ('' once released).
-- A lease whose deadline passed is free: its key stays, with its token.
--
-- A grant, a refresh and a release each write the key's new state and read
-- its old one in a single SET ... KEEPTTL GET, and write the old one back in
-- the rare case it was not theirs to change (held by another, or a value of
-- another format, such as an earlier warden's lock: its owner, with PX).
-- KEEPTTL keeps the key's expiry, which moves only when a grant or a refresh
-- needs a later day (keep): once a day for a key in constant use.
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

-- parse reads a state: its deadline (a number), then its token, day,
-- waiting flag and owner (strings); nothing for a missing key or a value of
-- another format.
local function parse(v)
  if not v then
    return nil
  end
  local d, token, day, waiting, owner = string.match(v, '^(%d+):(%d+):(%d+):([01]):(.*)$')
  if not d then
    return nil
  end
  return tonumber(d), token, day, waiting, owner
end

local function state(deadline, token, day, waiting, owner)
  return fmt(deadline) .. ':' .. token .. ':' .. day .. ':' .. waiting .. ':' .. owner
end

-- day_of is the day at whose end the key of a lease ending at deadline may
-- expire: the next day's end, so at least a day after the deadline.
local function day_of(deadline)
  return fmt(math.floor(deadline / day_ms) + 2)
end

-- next_grant is the token of a grant at us, after a state holding token
-- (nil for a key that is gone): greater than it, and not below the clock,
-- which is what keeps tokens growing when the state is lost.
local function next_grant(us, token)
  if token and tonumber(token) >= us then
    return tonumber(token) + 1
  end
  return us
end

-- swap writes v, keeping the key's expiry, and returns the old value
-- (false when there was none).
local function swap(key, v)
  local old = redis.pcall('set', key, v, 'KEEPTTL', 'GET')
  if type(old) == 'table' and old.err then
    error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
  end
  return old
end

local function put(key, v)
  redis.call('set', key, v, 'KEEPTTL')
end

-- restore writes back what swap replaced.
local function restore(key, old)
  if old then
    put(key, old)
  else
    redis.call('del', key)
  end
end

-- keep makes the key expire at the end of day, when it was set to expire
-- earlier (or not at all: a key swap created).
local function keep(key, old_day, day)
  if not old_day or tonumber(old_day) < tonumber(day) then
    redis.call('pexpireat', key, tonumber(day) * day_ms)
  end
end

-- is_free tells a lock that can be granted from its state: a key that is
-- gone, or a lease whose deadline passed. A value of another format is not.
local function is_free(v, d, now)
  return (not v) or (d ~= nil and d <= now)
end

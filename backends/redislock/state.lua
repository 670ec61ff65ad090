-- The state of a plain or fair lock is one string key, {<key>}:lock, that
-- outlives the lock as its fence:
--   '<deadline>:<token>:<day>:<waiting>:<owner>'
-- deadline: when the lease ends, in ms on the server's clock (0 once
-- released); token: the fencing token of the latest grant; day: the day
-- (since the epoch) at whose end the key expires, at least a day after the
-- deadline; waiting: '1' once a non-fair waiter announced itself, '2' once a
-- fair one did, which is what makes a release look for one (in the fair
-- queue only for '2'); owner: the holder's id ('' once released, and
-- '!forced:<the removed holder's token>' once ForceRelease took it, which
-- no id begins with: see force_release.lua).
-- A lease whose deadline passed is free: its key stays, with its token.
--
-- A grant, a refresh and a release each write the key's new state and read
-- its old one in a single SET ... KEEPTTL GET (XX for a refresh and a
-- release, which must not create the key), and write the old one back in
-- the rare case it was not theirs to change (held by another, or a value of
-- another format, such as an earlier warden's lock: its owner, with PX).
-- KEEPTTL keeps the key's expiry, which moves only when a grant or a refresh
-- needs a later day, by a SET of the state with PXAT (put_day): once a day
-- for a key in constant use. The helpers (clock, put, put_day...) are
-- backends/internal/redisstate's. The
-- scripts on every acquisition's path (acquire.lua, release.lua,
-- refresh_lock.lua) read and write the format themselves, with none of
-- these helpers: a helper is a closure made on every run of a script, and
-- the server spends on a script's Lua what it does not spend on others'
-- commands.

-- parse reads a state: its deadline (a number), then its token, day,
-- waiting flag and owner (strings); nothing for a missing key or a value of
-- another format.
local function parse(v)
  if not v then
    return nil
  end
  local d, token, day, waiting, owner = string.match(v, '^(%d+):(%d+):(%d+):([012]):(.*)$')
  if not d then
    return nil
  end
  return tonumber(d), token, day, waiting, owner
end

local function state(deadline, token, day, waiting, owner)
  return fmt(deadline) .. ':' .. token .. ':' .. day .. ':' .. waiting .. ':' .. owner
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

-- is_free tells a lock that can be granted from its state: a key that is
-- gone, or a lease whose deadline passed. A value of another format is not.
local function is_free(v, d, now)
  return (not v) or (d ~= nil and d <= now)
end

-- A waiter's probe: whether this node would grant a vote for the lock,
-- writing nothing. The waiter votes (acquire.lua) once a majority would.
-- KEYS[1] lock (see state.lua)
-- Returns 1 when the lock is free here, else 0 less the holder's pttl (0
-- when unknown). It reads the state with none of state.lua's helpers (see
-- acquire.lua).
local old = redis.call('get', KEYS[1])
if not old or string.sub(old, 1, 2) == '0:' then
  return 1
end
local t = redis.call('time')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local d = tonumber(string.match(old, '^(%d+):%d+:%d+:'))
if not d then
  return -math.max(redis.call('pttl', KEYS[1]), 0)
end
if d <= now then
  return 1
end
return now - d

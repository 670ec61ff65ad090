-- An operator's release of a plain or fair lock, whoever holds it: the
-- fence moves first, so that the next grant's token is greater than every
-- token the removed holder may still write with, then the lock goes and the
-- waiters are told.
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue  KEYS[4] deadlines
-- KEYS[5] waiters  ARGV[1] channel
-- Returns {owner or false, holder's token, holder's pttl}.
local owner = redis.call('get', KEYS[1])
if not owner then
  return {false, 0, 0}
end
local pttl = redis.call('pttl', KEYS[1])
local token = tonumber(redis.call('get', KEYS[2]) or '0')
next_token(KEYS[2])
redis.call('del', KEYS[1])
wake(ARGV[1], next_waiter(KEYS[3], KEYS[4], KEYS[5]))
return {owner, token, pttl}

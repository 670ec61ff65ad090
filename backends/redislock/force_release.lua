-- An operator's release of a plain or fair lock: of the holding the
-- operator saw (its token, and its label when given), or, asked for
-- explicitly, of whoever holds it. The check and the removal are this one
-- script, so a holder that took the lock after the operator looked is never
-- removed in its place. The fence moves first, so that the next grant's
-- token is greater than every token the removed holder may still write
-- with, then the lock goes and the waiters are told.
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue  KEYS[4] deadlines
-- KEYS[5] waiters  ARGV[1] channel  ARGV[2] '1' for any holder, '0' for
-- the one named  ARGV[3] its token  ARGV[4] '1' to match its label too
-- ARGV[5] the label
-- Returns {owner or false, holder's token, holder's pttl, 1 when removed}.
local owner = redis.call('get', KEYS[1])
if not owner then
  return {false, 0, 0, 0}
end
local pttl = redis.call('pttl', KEYS[1])
-- The fence moves only when the lock is granted, so while it reads the
-- token the operator saw, the holder is the one the operator saw.
local fence = redis.call('get', KEYS[2]) or '0'
local token = tonumber(fence)
if ARGV[2] ~= '1' then
  local slash = string.find(owner, '/', 1, true)
  local label = slash and string.sub(owner, slash + 1) or ''
  if fence ~= ARGV[3] or (ARGV[4] == '1' and label ~= ARGV[5]) then
    return {owner, token, pttl, 0}
  end
end
next_token(KEYS[2])
redis.call('del', KEYS[1])
wake(ARGV[1], next_waiter(KEYS[3], KEYS[4], KEYS[5]))
return {owner, token, pttl, 1}

-- An operator's release of a plain or fair lock: of the holding the
-- operator saw (its token, and its label when given), or, asked for
-- explicitly, of whoever holds it. The check and the removal are this one
-- script, so a holder that took the lock after the operator looked is never
-- removed in its place. The state left behind carries a token past the
-- removed holder's, so that the next grant's token is greater than every
-- token the removed holder may still write with; then the waiters are told.
-- Its owner is no holder's id but '!forced:' and the removed holder's
-- token, which the holder's refused renewal reads to say an operator took
-- its lock rather than that it expired (see refresh_lock.lua): a free
-- state to every script, this version's and earlier ones' (its deadline
-- is 0), until the next grant writes over it.
-- KEYS[1] lock  KEYS[2] queue  KEYS[3] deadlines  KEYS[4] waiters
-- ARGV[1] channel  ARGV[2] '1' for any holder, '0' for the one named
-- ARGV[3] its token  ARGV[4] '1' to match its label too  ARGV[5] the label
-- Returns {owner or false, holder's token, holder's pttl, 1 when removed}.
local us, now = clock()
local d, token, day, waiting, owner = parse(redis.call('get', KEYS[1]))
if not d or d <= now then
  return {false, 0, 0, 0}
end
local pttl = d - now
if ARGV[2] ~= '1' then
  local slash = string.find(owner, '/', 1, true)
  local label = slash and string.sub(owner, slash + 1) or ''
  if token ~= ARGV[3] or (ARGV[4] == '1' and label ~= ARGV[5]) then
    return {owner, tonumber(token), pttl, 0}
  end
end
put(KEYS[1], state(0, fmt(next_grant(us, token)), day, waiting, '!forced:' .. token))
wake(ARGV[1], next_waiter(KEYS[2], KEYS[3], KEYS[4], false))
return {owner, tonumber(token), pttl, 1}

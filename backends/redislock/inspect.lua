-- Who holds a plain or fair lock, read in one step so that the owner, its
-- remaining time and its token agree (see state.lua).
-- KEYS[1] lock  KEYS[2] queue (list)  KEYS[3] waiters (zset)
-- Returns {owner or false, pttl, token, waiters}.
-- It runs read-only (EVALSHA_RO, see scripter.runReadOnly): it must write
-- nothing.
local _, now = clock()
local d, token, _, _, owner = parse(redis.call('get', KEYS[1]))
local queued = redis.call('llen', KEYS[2]) + redis.call('zcount', KEYS[3], '(' .. now, '+inf')
if not d or d <= now then
  return {false, 0, 0, queued}
end
return {owner, d - now, tonumber(token), queued}

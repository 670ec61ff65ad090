-- Who holds a plain or fair lock, read in one step so that the owner, its
-- remaining time and the fence agree.
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue (list)  KEYS[4] waiters (zset)
-- Returns {owner or false, pttl, fence, waiters}.
local owner = redis.call('get', KEYS[1])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local queued = redis.call('llen', KEYS[3]) + redis.call('zcount', KEYS[4], '(' .. now, '+inf')
if not owner then
  return {false, 0, 0, queued}
end
return {owner, redis.call('pttl', KEYS[1]), tonumber(redis.call('get', KEYS[2]) or '0'), queued}

-- Fair acquisition: the lock goes to the oldest live waiter. Each waiter has
-- a place in a list and a deadline (server clock) in a sorted set; a waiter
-- that stops coming back (crashed) loses its place when its deadline passes.
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue (list)  KEYS[4] deadlines (zset)
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] '1' to queue when not acquired
-- ARGV[4] waiter timeout (ms)
-- Returns {1, token} or {0, holder's pttl (negative when none)}.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('zrangebyscore', KEYS[4], '-inf', now)
for _, id in ipairs(gone) do
  redis.call('lrem', KEYS[3], 0, id)
end
if #gone > 0 then
  redis.call('zremrangebyscore', KEYS[4], '-inf', now)
end
local head = redis.call('lindex', KEYS[3], 0)
if redis.call('exists', KEYS[1]) == 0 and ((not head) or head == ARGV[1]) then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if head then
    redis.call('lpop', KEYS[3])
    redis.call('zrem', KEYS[4], ARGV[1])
  end
  return {1, next_token(KEYS[2])}
end
if ARGV[3] == '1' then
  local timeout = tonumber(ARGV[4])
  if not redis.call('zscore', KEYS[4], ARGV[1]) then
    redis.call('rpush', KEYS[3], ARGV[1])
  end
  redis.call('zadd', KEYS[4], now + timeout, ARGV[1])
  -- The queue disappears with its last waiter.
  for i = 3, 4 do
    if redis.call('pttl', KEYS[i]) < timeout then
      redis.call('pexpire', KEYS[i], timeout)
    end
  end
end
return {0, redis.call('pttl', KEYS[1])}

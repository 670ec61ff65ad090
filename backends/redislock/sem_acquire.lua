-- A semaphore permit: holders are members of a sorted set scored by their
-- deadline (server clock), so the permit of a crashed holder comes back.
-- KEYS[1] holders (zset)  KEYS[2] fence
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] permits
-- Returns {1, token} or {0, ms until the earliest permit lapses}.
-- Checks and writes: lapsed permits are pruned, then counted, and the
-- token drawn, before the permit is written (see add_member): a command
-- that fails the script (which is not rolled back) leaves no permit past
-- the limit, and none the caller is not told of. A token drawn for a grant
-- that fails is skipped: tokens need only grow.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
if redis.call('zcard', KEYS[1]) < tonumber(ARGV[3]) then
  local token = next_token(KEYS[2])
  add_member(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
  return {1, token}
end
local first = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(first[2]) - now}

-- A semaphore permit: holders are members of a sorted set scored by their
-- deadline (server clock), so the permit of a crashed holder comes back.
-- KEYS[1] holders (zset)  KEYS[2] fence
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] permits
-- Returns {1, token} or {0, ms until the earliest permit lapses}.
-- Checks and writes: lapsed permits are pruned, then counted before the
-- permit is written: a command that fails the script (which is not rolled
-- back) leaves no permit past the limit.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
if redis.call('zcard', KEYS[1]) < tonumber(ARGV[3]) then
  local ttl = tonumber(ARGV[2])
  redis.call('zadd', KEYS[1], now + ttl, ARGV[1])
  if redis.call('pttl', KEYS[1]) < ttl then
    redis.call('pexpire', KEYS[1], ttl)
  end
  return {1, next_token(KEYS[2])}
end
local first = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(first[2]) - now}

-- A write lease: granted when there is neither a writer nor a live reader.
-- A writer that must wait records itself (with a deadline it keeps renewing
-- while it waits), which turns new readers away, so writers are not starved.
-- KEYS[1] readers (zset)  KEYS[2] writer  KEYS[3] waiting writers (zset)
-- KEYS[4] fence
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] '1' to record the wait
-- ARGV[4] waiter timeout (ms)
-- Returns {1, token} or {0, ms until the earliest blocking lease lapses}.
-- Checks and writes: lapsed members are pruned, then the writer and the
-- readers are read before the writer's key is written: a command that
-- fails the script (which is not rolled back) leaves no grant over a
-- holder. Each branch then writes its grant or its wait after every call
-- that may be refused (see add_member), so that a refusal leaves no writer
-- or wait the caller is not told of: a grant draws its token and takes out
-- the waiter's own record before it sets the key (a token drawn for a
-- grant that fails is skipped, as tokens need only grow, and the failed
-- acquisition takes its record out anyway), and a waiter reads what blocks
-- it before it records its wait.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
redis.call('zremrangebyscore', KEYS[3], '-inf', now)
if redis.call('exists', KEYS[2]) == 0 and redis.call('zcard', KEYS[1]) == 0 then
  local token = next_token(KEYS[4])
  redis.call('zrem', KEYS[3], ARGV[1])
  redis.call('set', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {1, token}
end
local p = redis.call('pttl', KEYS[2])
if p < 0 then
  local first = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
  p = tonumber(first[2]) - now
end
if ARGV[3] == '1' then
  add_member(KEYS[3], ARGV[1], now, tonumber(ARGV[4]))
end
return {0, p}

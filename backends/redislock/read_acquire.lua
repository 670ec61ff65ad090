-- A read lease: readers are members of a sorted set scored by their deadline
-- (server clock), so that each reader's lease expires on its own. A writer
-- that holds the lock, or one that is waiting, keeps new readers out.
-- KEYS[1] readers (zset)  KEYS[2] writer  KEYS[3] waiting writers (zset)
-- KEYS[4] fence
-- ARGV[1] owner  ARGV[2] ttl (ms)
-- Returns {1, token} or {0, ms until the blocking writer's lease or place lapses}.
-- Checks and writes: lapsed members are pruned, then the writer and the
-- waiting writers are read, and the token drawn, before the reader's
-- member is written (see add_member): a command that fails the script
-- (which is not rolled back) leaves no grant over a writer, and no reader
-- the caller is not told of. A token drawn for a grant that fails is
-- skipped: tokens need only grow.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
redis.call('zremrangebyscore', KEYS[3], '-inf', now)
local wpttl = redis.call('pttl', KEYS[2])
if wpttl == -2 and redis.call('zcard', KEYS[3]) == 0 then
  local token = next_token(KEYS[4])
  add_member(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
  return {1, token}
end
if wpttl < 0 then
  local first = redis.call('zrange', KEYS[3], 0, 0, 'WITHSCORES')
  wpttl = tonumber(first[2]) - now
end
return {0, wpttl}

-- Owner-checked release of a lease kept in a sorted set (reader, permit). A
-- member whose deadline passed is no longer held, even if not yet pruned.
-- KEYS[1] zset  ARGV[1] owner  ARGV[2] channel
-- ARGV[3] '1' to always notify, '0' only when the set became empty
-- Returns 1 when released, 0 when not held.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = redis.call('zscore', KEYS[1], ARGV[1])
if not deadline then
  return 0
end
redis.call('zrem', KEYS[1], ARGV[1])
if tonumber(deadline) <= now then
  return 0
end
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
if ARGV[3] == '1' or redis.call('zcard', KEYS[1]) == 0 then
  -- A wake-up, which waiters make up for by trying again: by pcall, so
  -- that a server that refuses it (an ACL user without the channel)
  -- fails nothing this script wrote.
  redis.pcall('publish', ARGV[2], '')
end
return 1

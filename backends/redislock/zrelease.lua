-- Owner-checked release of a lease kept in a sorted set (reader, permit). A
-- member whose deadline passed is no longer held, even if not yet pruned.
-- KEYS[1] zset  ARGV[1] owner  ARGV[2] channel
-- ARGV[3] '1' to always notify, '0' only when the set became empty
-- Returns 1 when released, 0 when not held.
--
-- No command names the set after the one that may empty it: Redis deletes
-- an empty set, and on the source node of a slot being moved to another, a
-- command on a key it no longer has fails the script there, after what it
-- wrote (a script is not rolled back) and before the wake-up.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = redis.call('zscore', KEYS[1], ARGV[1])
if not deadline then
  return 0
end
if tonumber(deadline) <= now then
  redis.call('zrem', KEYS[1], ARGV[1])
  return 0
end
-- Our own live member keeps the set while the others' lapsed ones go, and
-- while it is counted: it is the last when it is the only one.
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
local last = ARGV[3] ~= '1' and redis.call('zcard', KEYS[1]) == 1
redis.call('zrem', KEYS[1], ARGV[1])
if ARGV[3] == '1' or last then
  -- A wake-up, which waiters make up for by trying again: by pcall, so
  -- that a server that refuses it (an ACL user without the channel)
  -- fails nothing this script wrote.
  redis.pcall('publish', ARGV[2], '')
end
return 1

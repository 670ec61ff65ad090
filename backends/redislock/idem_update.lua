-- Extend, complete or abandon an idempotency record, only while the owner's
-- in-progress claim is live (its key has not expired): a stale owner's
-- write is refused.
-- KEYS[1] record (hash)  ARGV[1] owner  ARGV[2] 'extend' | 'complete' | 'abandon'
-- ARGV[3] lease or retention (ms)  ARGV[4] response (complete)
-- Returns 1 when done, 0 when the claim is not owner's.
local r = redis.call('hmget', KEYS[1], 'state', 'owner')
if r[1] ~= 'in_progress' or r[2] ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'abandon' then
  redis.call('del', KEYS[1])
  return 1
end
if ARGV[2] == 'complete' then
  redis.call('hset', KEYS[1], 'state', 'completed', 'response', ARGV[4])
end
redis.call('pexpire', KEYS[1], ARGV[3])
return 1

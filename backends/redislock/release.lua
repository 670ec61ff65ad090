-- Owner-checked release: a lease that expired and was taken over must not
-- delete the new owner's lock. The release message names one waiter, so
-- that only it retries: the next live fair waiter, else the non-fair waiter
-- recorded longest ago.
-- KEYS[1] lock  KEYS[2] queue  KEYS[3] deadlines  KEYS[4] waiters (zset)
-- ARGV[1] owner  ARGV[2] channel
-- Returns 1 when released, 0 when the lock was not owner's.
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('del', KEYS[1])
-- A waiting contender records itself (a fair place, or a record among the
-- waiters) before it sleeps: with neither, nobody waits to be told.
if redis.call('exists', KEYS[2], KEYS[4]) > 0 then
  wake(ARGV[2], next_waiter(KEYS[2], KEYS[3], KEYS[4]))
end
return 1

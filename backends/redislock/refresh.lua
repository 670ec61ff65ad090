-- Owner-checked extension of a lock held as a plain key (a writer's).
-- KEYS[1] lock  ARGV[1] owner  ARGV[2] ttl (ms)
-- Returns 1 when extended, 0 when the lock was not owner's.
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0

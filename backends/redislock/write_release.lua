-- Owner-checked release of a write lease; every waiter (readers and writers)
-- may try again.
-- KEYS[1] writer  ARGV[1] owner  ARGV[2] channel
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[2], '')
return 1

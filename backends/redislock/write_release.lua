-- Owner-checked release of a write lease; every waiter (readers and writers)
-- may try again.
-- KEYS[1] writer  ARGV[1] owner  ARGV[2] channel
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('del', KEYS[1])
-- A wake-up, which waiters make up for by trying again: by pcall, so
-- that a server that refuses it (an ACL user without the channel)
-- fails nothing this script wrote.
redis.pcall('publish', ARGV[2], '')
return 1

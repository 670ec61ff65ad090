-- A waiting writer gives up: readers it was keeping out may go.
-- KEYS[1] waiting writers (zset)  ARGV[1] owner  ARGV[2] channel
if redis.call('zrem', KEYS[1], ARGV[1]) == 1 then
  -- A wake-up, which waiters make up for by trying again: by pcall, so
  -- that a server that refuses it (an ACL user without the channel)
  -- fails nothing this script wrote.
  redis.pcall('publish', ARGV[2], '')
end
return 1

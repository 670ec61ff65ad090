-- Owner-checked extension of this node's vote.
-- KEYS[1] lock  ARGV[1] owner  ARGV[2] ttl (ms)
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0

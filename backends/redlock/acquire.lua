-- Take this node's vote for the lock if it is free, in one step, and report
-- the node's fence counter so that the client can compute a token above it.
-- KEYS[1] lock  KEYS[2] fence  ARGV[1] owner  ARGV[2] ttl (ms)
-- Returns {1, fence} or {0, holder's pttl}.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, redis.call('pttl', KEYS[1])}

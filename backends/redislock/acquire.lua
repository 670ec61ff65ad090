-- Take the lock if it is free, in one step, so that a crash can never leave
-- a lock without its expiry, and count the fence only on success.
-- KEYS[1] lock  KEYS[2] fence
-- ARGV[1] owner  ARGV[2] ttl (ms)
-- Returns {1, token} or {0, holder's pttl}.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, next_token(KEYS[2])}
end
return {0, redis.call('pttl', KEYS[1])}

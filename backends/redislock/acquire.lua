-- Take the lock if it is free, in one step, so that a crash can never leave
-- a lock without its expiry, and count the fence only on success. A waiting
-- contender that fails records itself among the lock's waiters, with a
-- deadline it renews by trying again, so that a release can wake one of
-- them, in whichever process, instead of all.
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] waiters (zset)
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] '1' to record the contender when
-- not acquired, '2' when it was recorded before  ARGV[4] waiter timeout (ms)
-- ARGV[5] its record: its Locker's wake-up channel, a newline, the owner
-- (see wake in next_waiter.lua)  ARGV[6] '1' when an earlier attempt of the
-- contender got no answer
-- Returns {1, token} or {0, holder's pttl}.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '2' then
    redis.call('zrem', KEYS[3], ARGV[5])
  end
  return {1, next_token(KEYS[2])}
end
-- An attempt whose answer never came may have taken the lock: it is the
-- contender's then, with the token that attempt drew, which nobody can have
-- moved since.
if ARGV[6] == '1' and redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('zrem', KEYS[3], ARGV[5])
  return {1, tonumber(redis.call('get', KEYS[2]))}
end
if ARGV[3] ~= '0' then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local timeout = tonumber(ARGV[4])
  redis.call('zadd', KEYS[3], now + timeout, ARGV[5])
  if redis.call('pttl', KEYS[3]) < timeout then
    redis.call('pexpire', KEYS[3], timeout)
  end
end
return {0, redis.call('pttl', KEYS[1])}

-- Take the lock if it is free, in one step, and draw its fencing token
-- (see state.lua). A waiting contender that fails records itself among the
-- lock's waiters, with a deadline it renews by trying again, and marks the
-- lock's state, so that its release wakes one of them, in whichever
-- process, instead of all.
-- KEYS[1] lock  KEYS[2] waiters (zset)
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] '1' to record the contender when
-- not acquired, '2' when it was recorded before  ARGV[4] waiter timeout (ms)
-- ARGV[5] its record: its Locker's wake-up channel, a newline, the owner
-- (see wake in next_waiter.lua)  ARGV[6] '1' when an earlier attempt of the
-- contender got no answer
-- Returns {1, token, day} or {0, holder's pttl}.
local us, now = clock()
local deadline = now + tonumber(ARGV[2])
local day = day_of(deadline)
local old = swap(KEYS[1], state(deadline, fmt(us), day, '0', ARGV[1]))
local d, token, old_day, waiting, owner = parse(old)
-- An attempt whose answer never came may have taken the lock: it is the
-- contender's then, with the token that attempt drew, which nobody can have
-- moved since.
local lost = ARGV[6] == '1' and d ~= nil and d > now and owner == ARGV[1]
if is_free(old, d, now) or lost then
  local t = us
  if lost then
    t = tonumber(token)
  else
    t = next_grant(us, token)
  end
  if ARGV[3] == '2' or ARGV[6] == '1' then
    redis.call('zrem', KEYS[2], ARGV[5])
  end
  -- Other waiters may still wait: the flag stays until a release finds
  -- none.
  if t ~= us or waiting == '1' then
    put(KEYS[1], state(deadline, fmt(t), day, waiting or '0', ARGV[1]))
  end
  keep(KEYS[1], old_day, day)
  return {1, t, tonumber(day)}
end
local flag = waiting
if ARGV[3] ~= '0' then
  local timeout = tonumber(ARGV[4])
  redis.call('zadd', KEYS[2], now + timeout, ARGV[5])
  if redis.call('pttl', KEYS[2]) < timeout then
    redis.call('pexpire', KEYS[2], timeout)
  end
  flag = '1'
end
if not d then
  -- Another format: an earlier warden's lock, with its own expiry.
  put(KEYS[1], old)
  return {0, redis.call('pttl', KEYS[1])}
end
if flag ~= waiting then
  put(KEYS[1], state(d, token, old_day, flag, owner))
else
  put(KEYS[1], old)
end
return {0, d - now}

-- Take the lock if it is free, in one step, and draw its fencing token
-- (see state.lua). A waiting contender that fails records itself among the
-- lock's waiters, with a deadline it renews by trying again, and marks the
-- lock's state, so that its release wakes one of them, in whichever
-- process, instead of all.
-- KEYS[1] lock  KEYS[2] waiters (zset)
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] '0' for a contender that does
-- not wait, '1' for one to record when not acquired, '2' for one recorded
-- before, whose record is to be renewed, '3' for one recorded lately
-- ARGV[4] waiter timeout (ms)  ARGV[5] its record: its Locker's wake-up
-- channel, a newline, the owner (see wake in next_waiter.lua)  ARGV[6] '1'
-- when an earlier attempt of the contender got no answer
-- Returns {1, token, day, waiting flag} or {0, holder's pttl}.
local us, now = clock()
local deadline = now + tonumber(ARGV[2])
local day = day_of(deadline)
local mode = ARGV[3]
local recorded = mode == '2' or mode == '3'
-- A contender that comes back after waiting is likely to find the lock
-- taken again: it reads the state before writing, where the others, likely
-- to find the lock free, write theirs at once and read the old one with it.
local swapped = not recorded
local old
if swapped then
  old = swap(KEYS[1], state(deadline, fmt(us), day, '0', ARGV[1]))
else
  old = redis.call('get', KEYS[1])
end
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
  if recorded or ARGV[6] == '1' then
    redis.call('zrem', KEYS[2], ARGV[5])
  end
  -- Other waiters may still wait: the flag stays until a release finds
  -- none.
  if not swapped or t ~= us or (waiting and waiting ~= '0') then
    put(KEYS[1], state(deadline, fmt(t), day, waiting or '0', ARGV[1]))
  end
  keep(KEYS[1], old_day, day)
  return {1, t, tonumber(day), tonumber(waiting or '0')}
end
local flag = waiting
if mode ~= '0' then
  if mode ~= '3' then
    local timeout = tonumber(ARGV[4])
    redis.call('zadd', KEYS[2], now + timeout, ARGV[5])
    if redis.call('pttl', KEYS[2]) < timeout then
      redis.call('pexpire', KEYS[2], timeout)
    end
  end
  flag = announce(waiting, '1')
end
if not d then
  -- Another format: an earlier warden's lock, with its own expiry.
  if swapped then
    put(KEYS[1], old)
  end
  return {0, redis.call('pttl', KEYS[1])}
end
if flag ~= waiting then
  put(KEYS[1], state(d, token, old_day, flag, owner))
elseif swapped then
  put(KEYS[1], old)
end
return {0, d - now}

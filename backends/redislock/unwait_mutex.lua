-- A non-fair waiter gives up. If the lock is free, it may have been woken
-- for it: the next waiter is told instead, since no release will come.
-- KEYS[1] lock  KEYS[2] queue  KEYS[3] deadlines  KEYS[4] waiters (zset)
-- ARGV[1] the waiter's record (see acquire.lua)  ARGV[2] channel
if redis.call('zrem', KEYS[4], ARGV[1]) == 1 then
  local v = redis.call('get', KEYS[1])
  local _, now = clock()
  if is_free(v, parse(v), now) then
    local next = next_waiter(KEYS[2], KEYS[3], KEYS[4], false)
    if next ~= '' then
      wake(ARGV[2], next)
    end
  end
end
return 1

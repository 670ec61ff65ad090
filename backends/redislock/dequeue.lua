-- A fair waiter gives up its place. When the lock is free, the new head of
-- the queue is told, since no release will come to wake it.
-- KEYS[1] queue  KEYS[2] deadlines  KEYS[3] lock
-- ARGV[1] the waiter's place (see fair_acquire.lua)  ARGV[2] channel
redis.call('lrem', KEYS[1], 0, ARGV[1])
redis.call('zrem', KEYS[2], ARGV[1])
local v = redis.call('get', KEYS[3])
local _, now = clock()
if is_free(v, parse(v), now) then
  local head = redis.call('lindex', KEYS[1], 0)
  if head then
    wake(ARGV[2], head)
  end
end
return 1

-- Owner-checked release: a lease that expired and was taken over must not
-- delete the new owner's lock. The release message names the next live fair
-- waiter, so that only it retries; non-fair waiters retry on any message.
-- KEYS[1] lock  KEYS[2] queue  KEYS[3] deadlines
-- ARGV[1] owner  ARGV[2] channel
-- Returns 1 when released, 0 when the lock was not owner's.
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('del', KEYS[1])
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local next = ''
while true do
  local head = redis.call('lindex', KEYS[2], 0)
  if not head then
    break
  end
  local deadline = redis.call('zscore', KEYS[3], head)
  if deadline and tonumber(deadline) > now then
    next = head
    break
  end
  redis.call('lpop', KEYS[2])
  redis.call('zrem', KEYS[3], head)
end
redis.call('publish', ARGV[2], next)
return 1

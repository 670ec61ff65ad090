-- next_waiter names whom a free lock's message should wake: the head of
-- the fair queue if it is still alive (dead heads are dropped), else the
-- live non-fair waiter whose record is oldest, else nobody (''), which
-- wakes every waiter that listens without a name.
local function next_waiter(queue, deadlines, waiters)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while true do
    local head = redis.call('lindex', queue, 0)
    if not head then
      break
    end
    local deadline = redis.call('zscore', deadlines, head)
    if deadline and tonumber(deadline) > now then
      return head
    end
    redis.call('lpop', queue)
    redis.call('zrem', deadlines, head)
  end
  redis.call('zremrangebyscore', waiters, '-inf', now)
  local oldest = redis.call('zrange', waiters, 0, 0)
  if oldest[1] then
    return oldest[1]
  end
  return ''
end

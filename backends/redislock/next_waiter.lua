-- next_waiter names whom a free lock's message should wake: the head of
-- the fair queue if it is still alive (dead heads are dropped), else the
-- live non-fair waiter whose record is oldest, else nobody (''), which
-- wakes every waiter that listens without a name. nonfair_only says no fair
-- waiter announced itself, so that the queue need not be looked at. With
-- pop, a non-fair record named is taken out of the waiters, for a release
-- to hand the lock to, and its score comes second, to put it back with
-- (nil for the queue's head or nobody); the server's clock, in ms and us,
-- comes third and fourth.
--
-- The queue, the deadlines and the waiters are read by pcall, and an error
-- taken for an empty one: a dead head or record taken out may have been the
-- last, and Redis deletes an emptied list or set; on the source node of a
-- slot being moved to another, a command on a key it no longer has fails
-- the script there, after what it wrote (a script is not rolled back) and
-- before the wake-up.
local function next_waiter(queue, deadlines, waiters, nonfair_only, pop)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while not nonfair_only do
    local head = redis.pcall('lindex', queue, 0)
    if type(head) ~= 'string' then
      break
    end
    local deadline = redis.pcall('zscore', deadlines, head)
    if type(deadline) == 'string' and tonumber(deadline) > now then
      return head, nil, now, t[1] * 1000000 + t[2]
    end
    redis.call('lpop', queue)
    redis.pcall('zrem', deadlines, head)
  end
  -- Records sort by deadline, so any dead ones come first: pruning only
  -- when the first is dead saves a command on most releases.
  local oldest = (pop and redis.pcall('zpopmin', waiters)) or redis.pcall('zrange', waiters, 0, 0, 'WITHSCORES')
  if oldest[1] and tonumber(oldest[2]) <= now then
    redis.pcall('zremrangebyscore', waiters, '-inf', now)
    oldest = (pop and redis.pcall('zpopmin', waiters)) or redis.pcall('zrange', waiters, 0, 0, 'WITHSCORES')
  end
  return oldest[1] or '', pop and oldest[2], now, t[1] * 1000000 + t[2]
end

-- wake tells next, as next_waiter named it, that the lock is free. The
-- record of a mutex waiter (a fair place, or a non-fair waiter's record)
-- carries the channel of its own Locker, after the place's timeout if any
-- and before a newline and the owner: the message goes there, to the one
-- connection that waits for it, rather than to every process subscribed to
-- the lock's channel. Records without one (an earlier version's), and the
-- empty name, go to the lock's channel. The message is only a wake-up,
-- which a waiter makes up for by trying again (see the README): it is
-- sent by pcall, so that a server that refuses it (an ACL user without
-- the channel) undoes nothing, since a script is not rolled back, and
-- fails nothing that the script wrote.
local function wake(channel, next)
  local own = string.match(next, '^%d*:?([^\n]*)\n')
  if own then
    redis.pcall('publish', own, next)
  else
    redis.pcall('publish', channel, next)
  end
end

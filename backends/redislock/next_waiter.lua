-- here passes on what a pcall answered for a key the script may have
-- emptied: Redis deletes an emptied list or set, and on the source node of
-- a slot being moved to another, a command on a key the node no longer has
-- fails the script there, after what it wrote (a script is not rolled
-- back). That error alone gives false, which its callers take for an empty
-- key; any other (a user without the command, the cluster down) is raised,
-- as a call would have.
local function here(r)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'non local key', 1, true) then
      return false
    end
    error(r)
  end
  return r
end

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
-- The queue, the deadlines and the waiters are read through here: a dead
-- head or record taken out may have been the last, and the wake-up is yet
-- to come.
local function next_waiter(queue, deadlines, waiters, nonfair_only, pop)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while not nonfair_only do
    local head = here(redis.pcall('lindex', queue, 0))
    if type(head) ~= 'string' then
      break
    end
    local deadline = here(redis.pcall('zscore', deadlines, head))
    if type(deadline) == 'string' and tonumber(deadline) > now then
      return head, nil, now, t[1] * 1000000 + t[2]
    end
    redis.call('lpop', queue)
    here(redis.pcall('zrem', deadlines, head))
  end
  -- Records sort by deadline, so any dead ones come first: pruning only
  -- when the first is dead saves a command on most releases.
  local function first()
    if pop then
      return here(redis.pcall('zpopmin', waiters)) or {}
    end
    return here(redis.pcall('zrange', waiters, 0, 0, 'WITHSCORES')) or {}
  end
  local oldest = first()
  if oldest[1] and tonumber(oldest[2]) <= now then
    here(redis.pcall('zremrangebyscore', waiters, '-inf', now))
    oldest = first()
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

-- handoff_of is the waiter timeout (ms) that a fair place records, and the
-- handoff window (ms) its waiter has to claim the lock as the head of the
-- queue: a fifth of the timeout, 250ms at most and 1ms at least, as
-- handoffWindow in locker.go has it. A place of an earlier version, which
-- records no timeout, gives nil, as does one of no shape the scripts write
-- (they split a place at its first newline).
local function handoff_of(place)
  local period = tonumber(string.match(place, '^(%d+):[^\n]*\n') or '')
  if period then
    return period, math.max(math.min(250, math.floor(period / 5)), 1)
  end
end

-- The rest of the release (see release_head.lua, which runs first and
-- leaves old, the state it replaced, and given, the waiting flag its
-- grant found, or handing or reserving, having written nothing; free, the
-- free state it wrote, and my_owner, my_token and my_day, the owner's,
-- which it parsed from the client's tail when the client packed them,
-- my_owner false when that tail was not as the client makes it).
--
-- Checks and writes: the SET GET that writes the free state, a grant or a
-- reservation is also the owner check. A state that was not the owner's is written back
-- as the next write, and only then is a waiter's record taken for the
-- grant put back: a script is not rolled back, and a command that fails it
-- at any point (on the source node of a slot being moved, see put_back)
-- leaves the state as it was, or free in the owner's name, never granted
-- over another holder.
local waiters = KEYS[4] or KEYS[2]
-- put_back returns a record a release took out of the waiters and did not
-- grant, through here (see next_waiter.lua): on the source node of a slot
-- being moved, a set that the record's taking emptied is gone, and the
-- record is then lost (its waiter comes back within its lost wake-up's
-- bound, see wait.go), which costs a wait, not the lock. now is the
-- server's clock (ms) when the record was taken, before its deadline.
local function put_back(score, record, now)
  if not here(redis.pcall('zadd', waiters, score, record)) then
    return
  end
  -- A ZPOPMIN that emptied the key took its expiry with it, and the
  -- record's deadline is when the key may go: PEXPIRE, which acquire.lua
  -- calls to keep the records, so that no other command is needed.
  if redis.call('pttl', waiters) < 0 then
    redis.call('pexpire', waiters, score - now)
  end
end
-- granted is the state of a grant to who until deadline (the server's
-- clock, ms), made at us (microseconds), with the waiting flag: its token
-- is past the owner's, token, and not below the clock. It returns the day
-- and the token (digits) too. A %.0f costs the server more than a
-- command: the token is formatted once, and the deadline as two %d parts
-- (a C long, 32 bits on some builds; see acquire.lua).
local function granted(who, deadline, token, us, flag)
  local tk = tonumber(token)
  if tk >= us then
    tk = tk + 1
  else
    tk = us
  end
  tk = string.format('%.0f', tk)
  local day = math.floor(deadline / 86400000) + 2
  local dhi = math.floor(deadline / 1000000)
  return string.format('%d%06d:%s:%d:%s:%s', dhi, deadline - dhi * 1000000, tk, day, flag, who), day, tk
end
local popped, popped_score, popped_at, wrote
if reserving then
  -- The head of the fair queue, alive, is likely there: the lock is
  -- reserved for it (see below) in the SET GET that also reads the state
  -- to check, a write less than freeing the lock first; the message wakes
  -- it. A dead head, a place of an earlier version (which says no
  -- window), or a state not the owner's with that token, day and flag
  -- takes the rest of the script, as release_head.lua's SET GET would
  -- have had it. Its owner check is the handing's, just after: a change
  -- to one is a change to its twin.
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local head = here(redis.pcall('lindex', KEYS[2], 0))
  local due = type(head) == 'string' and here(redis.pcall('zscore', KEYS[3], head))
  local window = type(due) == 'string' and tonumber(due) > now and select(2, handoff_of(head))
  local state, new_day
  if window then
    local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    state, new_day = granted(string.sub(head, string.find(head, '\n', 1, true) + 1), now + window, my_token, us, '2')
    old = redis.call('set', KEYS[1], state, 'XX', 'KEEPTTL', 'GET')
    local mine = ':' .. my_token .. ':' .. my_day .. ':2:' .. my_owner
    local at = old and #old - #mine
    if at and at > 0 and string.sub(old, at + 1) == mine and string.find(old, ':', 1, true) == at + 1 then
      if tonumber(my_day) < new_day then
        redis.call('set', KEYS[1], state, 'PXAT', new_day * 86400000)
      end
      wake(ARGV[4], head)
      return now
    end
  else
    old = redis.call('set', KEYS[1], free, 'XX', 'KEEPTTL', 'GET')
  end
  wrote = state
elseif handing then
  -- The oldest live waiter's record is taken first, and the grant in its
  -- name written over the owner's state in one SET GET, which is checked
  -- after: freeing the lock first and granting it next would cost a write
  -- more. The grant's token is past the owner's, which the check finds in
  -- the state, and not below the clock. Any other state (not the owner's
  -- with that token, day and flag; a fair waiter announced itself; an
  -- earlier version's record) is put back as it was, with the record, and
  -- the release goes on as release_head.lua's SET GET would have had it.
  --
  -- As acquire.lua, it keeps the clock, the token and the day as digits
  -- wherever it can, comparing them as strings (a conversion of a number
  -- costs the server more than the rest of a command): so it takes the
  -- record itself, as next_waiter would, comparing the oldest record's
  -- deadline with the clock as digits too. Its grant (the token rule, the
  -- state's format, the message) and its owner check are those of the rest
  -- of this script and of release_head.lua, written again in digits: a
  -- change to one of them is a change to its twins.
  local t = redis.call('time')
  local usec = t[2]
  local us = t[1] .. string.sub('00000', #usec) .. usec
  local ms = string.sub(us, 1, -4)
  -- Records sort by deadline, so any dead ones come first. Through here,
  -- as in next_waiter: a dead record taken out may have been the last.
  local oldest = here(redis.pcall('zpopmin', waiters)) or {}
  local s = oldest[2]
  if s and (#s < #ms or (#s == #ms and s <= ms)) then
    here(redis.pcall('zremrangebyscore', waiters, '-inf', ms))
    oldest = here(redis.pcall('zpopmin', waiters)) or {}
  end
  local next, score = oldest[1] or '', oldest[2]
  local channel, px, who = string.match(next, '^([^\n]*)\n(%d+)\n(.*)$')
  local state, tk, new_day, now
  if px then
    now = tonumber(ms)
    local deadline = now + px
    new_day = string.format('%d', math.floor(deadline / 86400000) + 2)
    tk = my_token
    if #tk > #us or (#tk == #us and tk >= us) then
      tk = string.format('%.0f', tonumber(tk) + 1)
    else
      tk = us
    end
    local dhi = math.floor(deadline / 1000000)
    state = string.format('%d%06d:%s:%s:1:%s', dhi, deadline - dhi * 1000000, tk, new_day, who)
  elseif not score then
    -- Nobody waits any more: the flag goes.
    state = '0:' .. my_token .. ':' .. my_day .. ':0:'
  end
  if state then
    old = redis.call('set', KEYS[1], state, 'XX', 'KEEPTTL', 'GET')
    -- The owner's state is '<deadline>' (digits, no ':') followed by mine.
    local mine = ':' .. my_token .. ':' .. my_day .. ':1:' .. my_owner
    local at = old and #old - #mine
    if at and at > 0 and string.sub(old, at + 1) == mine and string.find(old, ':', 1, true) == at + 1 then
      if not px then
        return 1
      end
      -- A later day is set with the state (see the grant below).
      local day = my_day
      if #day < #new_day or (#day == #new_day and day < new_day) then
        redis.call('set', KEYS[1], state, 'PXAT', new_day * 86400000)
      end
      -- By pcall, as wake sends it (see next_waiter.lua).
      redis.pcall('publish', channel, '=' .. tk .. ':' .. new_day .. ':1\n' .. next)
      return now
    end
  else
    old = redis.call('set', KEYS[1], free, 'XX', 'KEEPTTL', 'GET')
  end
  -- The record taken is put back below, after the state is put right: a
  -- command that fails the script between them must leave the state as it
  -- was or free in the owner's name, never a grant over another holder's.
  popped, popped_score, popped_at, wrote = next, score, ms, state
end
local token, day, waiting, owner
if old then
  token, day, waiting, owner = string.match(old, '^%d+:(%d+):(%d+):([012]):(.*)$')
end
if owner ~= my_owner then
  -- Not the owner's (or another format): what was there is written back,
  -- as the first write after the check.
  if old then
    redis.call('set', KEYS[1], old, 'KEEPTTL')
  end
  if popped_score then
    put_back(popped_score, popped, popped_at)
  end
  return 0
end
if handing or reserving then
  -- The owner's, with another token, day or flag: what the SET GET wrote
  -- (a grant in a waiter's name, or the free state without the flag)
  -- gives way to the free state, which the rest goes on from as from
  -- release_head.lua's SET GET.
  if wrote then
    redis.call('set', KEYS[1], free, 'KEEPTTL')
  end
  if popped_score then
    put_back(popped_score, popped, popped_at)
  end
end
if waiting == '2' and not KEYS[4] then
  redis.call('set', KEYS[1], old, 'KEEPTTL')
  return -1
end
local flag = '0'
local next, score, now, us = ''
if waiting ~= '0' then
  next, score, now, us = next_waiter(KEYS[2], KEYS[3], waiters, waiting == '1', true)
  if next ~= '' then
    flag = waiting
  end
end
-- grant writes the lock's state granted to who for px ms from now, with a
-- token past the owner's and not below the clock, and returns the token
-- (digits) and the day.
local function grant(who, px)
  -- The flag stays: the release of this grant looks for more waiters. A
  -- later day is set by the grant's SET, not by a PEXPIREAT after it:
  -- refused (an ACL user without it), that would stop the script with the
  -- waiter's grant and its day written and the key's old expiry, which the
  -- grant's refreshes, finding the day, would not move.
  local v, new_day, tk = granted(who, now + px, token, us, flag)
  if tonumber(day) < new_day then
    redis.call('set', KEYS[1], v, 'PXAT', new_day * 86400000)
  else
    redis.call('set', KEYS[1], v, 'KEEPTTL')
  end
  return tk, new_day
end
-- The head of the fair queue, alive, has a handoff window (a place of an
-- earlier version says none).
local window
if next ~= '' and not score then
  window = select(2, handoff_of(next))
end
if score then
  -- A record '<channel>\n<ttl>\n<owner>'; an earlier version's has no ttl.
  local channel, px, who = string.match(next, '^([^\n]*)\n(%d+)\n(.*)$')
  if px then
    local tk, new_day = grant(who, px)
    -- By pcall, as wake sends it (see next_waiter.lua).
    redis.pcall('publish', channel, string.format('=%s:%d:%s\n', tk, new_day, flag) .. next)
    return now
  end
  -- Its waiter takes it out when it gets the lock.
  put_back(score, next, now)
end
if window then
  -- The head of the fair queue, alive: the lock is reserved for it, granted
  -- in its owner's name for its handoff window, and the message wakes it
  -- to claim it, which extends the grant to its TTL (see fair_acquire.lua).
  -- Until then nobody else takes the lock (the releaser coming straight
  -- back is refused, as when the head has claimed it), and a head that
  -- does not claim it in time, nor renew its place, is dropped by the
  -- next waiter that finds the reservation lapsed.
  grant(string.sub(next, string.find(next, '\n', 1, true) + 1), window)
elseif token ~= my_token or day ~= my_day or flag ~= given then
  redis.call('set', KEYS[1], '0:' .. token .. ':' .. day .. ':' .. flag .. ':', 'KEEPTTL')
end
if next ~= '' then
  -- '{<key>}:lock' gives '{<key>}:released'.
  wake((KEYS[4] and ARGV[4]) or (string.sub(KEYS[1], 1, -5) .. 'released'), next)
end
if window then
  return now
end
return 1

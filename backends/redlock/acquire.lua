-- Take this node's vote for the lock if it is free, or if it already is this
-- owner's (the client sent the call again after losing its answer), so that
-- a refusal always means another owner's vote: the client then has nothing to
-- withdraw from this node.
--
-- The node's fence is its counter, or its clock in microseconds when that is
-- greater, so that tokens stay above every token issued before even when
-- nodes lost their counters (restarted without persistence), as long as
-- their clocks do not run behind by more than the time they were away. The
-- client proposes a token, and a node whose fence is below it records it in
-- the same step as the vote. A token recorded on a majority this way is above
-- every earlier token (any earlier token was recorded on a majority, which
-- shares a node with this one), so no second round has to write it back. A
-- proposal further ahead of the node's clock than the client's bound is not
-- recorded, so that fences stay close to the clocks. A fence expires a day
-- at least after it was last written (see state.lua): it is never more than
-- the bound ahead of the clock when written, so the clock alone is past it a
-- day later, unless the node's clock was stepped back by nearly a day
-- meanwhile.
-- KEYS[1] lock (see state.lua)  ARGV[1] owner  ARGV[2] ttl (ms)
-- ARGV[3] proposed token  ARGV[4] bound on its lead over the clock (µs)
-- ARGV[5] '1' when the owner's last attempt found the lock held: the state
-- is then read before it is written, so that a vote refused again writes
-- nothing (the first attempt, likely to find the lock free, writes its
-- vote at once and reads the old state with it); '2' to read only, a probe
-- that answers whether the vote would be granted and writes nothing
-- Returns {1, fence before, 1 if the proposal was recorded else 0, day},
-- {0, holder's pttl}, or for a probe that finds the lock free {2, 0}.
--
-- This script runs on every acquisition, so it spends little: it uses none
-- of state.lua's helpers (a helper is a closure made on every run), and it
-- turns numbers into strings once, in one string.format, since Lua's
-- number formatting costs more than the rest of a vote. Numbers past 2^31
-- are written with %.0f, exact up to 2^53: %d is a C long, which a 32-bit
-- build of Redis would cut short.
local t = redis.call('time')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local us = t[1] * 1000000 + t[2]
local deadline = now + ARGV[2]
local day = math.floor(deadline / 86400000) + 2
local proposed = tonumber(ARGV[3])
local acceptable = proposed > us and proposed <= us + ARGV[4]
local written = us
if acceptable then
  written = proposed
end
local read_first = ARGV[5] ~= '0'
local old
if read_first then
  old = redis.call('get', KEYS[1])
else
  old = redis.pcall('set', KEYS[1], string.format('%.0f:%.0f:%d:%s', deadline, written, day, ARGV[1]), 'KEEPTTL', 'GET')
  if type(old) == 'table' and old.err then
    error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
  end
end
local d, stored, old_day, owner
if old then
  d, stored, old_day, owner = string.match(old, '^(%d+):(%d+):(%d+):(.*)$')
  d = tonumber(d)
end
if old and not (d and (d <= now or owner == ARGV[1])) then
  -- Another owner's vote, or a value of another format (an earlier
  -- warden's vote, with PX): it stays as it was.
  if not read_first then
    redis.call('set', KEYS[1], old, 'KEEPTTL')
  end
  if d then
    return {0, d - now}
  end
  return {0, redis.call('pttl', KEYS[1])}
end
if ARGV[5] == '2' then
  return {2, 0}
end
local fence = us
if stored then
  local last = tonumber(stored)
  if last > us then
    fence = last
  end
end
local recorded = acceptable and proposed > fence
local kept = fence
if recorded then
  kept = written
end
-- The counter never moves back.
if read_first or kept ~= written then
  redis.call('set', KEYS[1], string.format('%.0f:%.0f:%d:%s', deadline, kept, day, ARGV[1]), 'KEEPTTL')
end
-- The key expires at the end of day, moved once a day for a key in
-- constant use.
if not old_day or tonumber(old_day) < day then
  redis.call('pexpireat', KEYS[1], day * 86400000)
end
if recorded then
  return {1, fence, 1, day}
end
return {1, fence, 0, day}

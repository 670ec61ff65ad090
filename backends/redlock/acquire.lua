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
-- ARGV[5] given (any value) when the owner's last attempt found the lock
-- held: the state is then read before it is written, so that a vote
-- refused again writes nothing (the first attempt, likely to find the lock
-- free, writes its vote at once and reads the old state with it). A waiter
-- reads the nodes' states first (probeNodes).
-- Returns 1 when the vote is granted and the proposal recorded; the node's
-- fence before the vote (digits) when granted without recording the
-- proposal; when refused, 0 less the holder's pttl (0 when unknown).
--
-- This script runs on every acquisition, so it spends little: it uses none
-- of state.lua's helpers (a helper is a closure made on every run), it
-- answers one integer or string where a table costs the server more, and it
-- keeps the clock's microseconds, the fence and the proposal as digits
-- wherever it can: a tonumber of a 16-digit string costs the server about
-- 4k instructions, a %.0f of such a number about 6k, a pattern match of the
-- state 7k, against a few hundred for a comparison or a concatenation of
-- strings. %d takes a C long, which a 32-bit build of Redis would cut short
-- past 2^31, so the deadline (13 digits) is written as two %d parts.
--
-- Digits compared as strings have no leading zeros: the longer is the
-- greater, and of equal lengths the one that sorts after (Lua compares
-- strings with strcoll, which orders digits as numbers in every locale).
local t = redis.call('time')
local usec = t[2]
-- The clock in microseconds, as digits (TIME answers the microseconds
-- without leading zeros) and as a number.
local us = t[1] .. string.sub('00000', #usec) .. usec
local usn = tonumber(us)
local now = math.floor(usn / 1000)
local deadline = now + ARGV[2]
local day = math.floor(deadline / 86400000) + 2
local dhi = math.floor(deadline / 1000000)
local dlo = deadline - dhi * 1000000
local proposal = ARGV[3]
local written = us
if (#proposal > #us or (#proposal == #us and proposal > us)) and tonumber(proposal) - usn <= tonumber(ARGV[4]) then
  written = proposal
end
local read_first = ARGV[5]
local old
if read_first then
  old = redis.call('get', KEYS[1])
else
  old = redis.pcall('set', KEYS[1], string.format('%d%06d:%s:%d:%s', dhi, dlo, written, day, ARGV[1]), 'KEEPTTL', 'GET')
  if type(old) == 'table' and old.err then
    -- A server older than 6.2 knows no GET for SET: a syntax error. Any
    -- other refusal (OOM under noeviction, a replica's READONLY) is
    -- the server's own, and says so.
    if string.find(old.err, 'syntax error', 1, true) then
      error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
    end
    error(old)
  end
end
-- The fence stored, and the key's day, as digits.
local stored, old_day
if old then
  -- Withdrawn, the common state: '0:<fence>:<day>:'.
  local e = string.sub(old, 1, 2) == '0:' and string.find(old, ':', 3, true)
  if e then
    stored, old_day = string.sub(old, 3, e - 1), string.sub(old, e + 1, -2)
  else
    local d, owner
    d, stored, old_day, owner = string.match(old, '^(%d+):(%d+):(%d+):(.*)$')
    d = tonumber(d)
    if not (d and (d <= now or owner == ARGV[1])) then
      -- Another owner's vote, or a value of another format (an earlier
      -- warden's vote, with PX): it stays as it was.
      if not read_first then
        redis.call('set', KEYS[1], old, 'KEEPTTL')
      end
      if d then
        return now - d
      end
      return -math.max(redis.call('pttl', KEYS[1]), 0)
    end
  end
end
local fence = us
if stored and (#stored > #us or (#stored == #us and stored > us)) then
  fence = stored
end
-- The counter never moves back: the proposal is recorded only above it.
local recorded = written ~= us and (#written > #fence or (#written == #fence and written > fence))
local kept = fence
if recorded then
  kept = written
end
if read_first or kept ~= written then
  redis.call('set', KEYS[1], string.format('%d%06d:%s:%d:%s', dhi, dlo, kept, day, ARGV[1]), 'KEEPTTL')
end
-- The key expires at the end of day, moved once a day for a key in
-- constant use.
local od = old_day and tonumber(old_day)
if not od or od < day then
  local e = redis.pcall('pexpireat', KEYS[1], day * 86400000)
  if type(e) == 'table' and e.err then
    -- Refused (an ACL without PEXPIREAT): the vote is taken back, or
    -- the next would find its day set, skip this, and be granted on a
    -- key that never expires.
    if old then
      redis.call('set', KEYS[1], old, 'KEEPTTL')
    else
      redis.call('del', KEYS[1])
    end
    error(e)
  end
end
if recorded then
  return 1
end
return fence

-- Owner-checked extension of a plain or fair lock (see state.lua, whose
-- format this script reads and writes, with none of its helpers: see
-- acquire.lua): only a lease still the owner's and not yet expired is
-- extended.
-- KEYS[1] lock  ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] its token
-- Returns the key's day when extended; when the lock was not owner's, a
-- letter for why, which its holder's error says (see lease.notHeld in
-- lease.go): 'f' an operator's ForceRelease took it (the free state it
-- left names the owner's token), 'e' it expired and nobody took it since
-- (the state is still the owner's), 't' a holder with a later token took it
-- since, 'r' the owner released it, 'g' the key is gone, 'o' anything else
-- (another format, an earlier token). refresh_locks.lua tells them alike.
-- The SET GET that extends is also the check: a state that was not the
-- owner's is written back as the next write, with no command between that
-- could fail the script (which is not rolled back) and leave the extension.
-- It is XX: a key that is gone (deleted by hand, a restart without
-- persistence) stays gone, where a SET would create it, without an expiry,
-- and a DEL to take it back could be refused (an ACL user without DEL),
-- leaving for good a lease that the next refresh would take for its own.
-- A later day is set by a SET of the extended state with PXAT, not by a
-- PEXPIREAT after it: a refused PEXPIREAT (an ACL user without it) would
-- stop the script with the state's new day written, the next refresh would
-- find it and succeed, and the key would expire with its old day, before
-- the lease's end. That SET is refused no more than the SET GET was: the
-- same command on the same key, and a script that wrote is not refused
-- more writes for memory.
local t = redis.call('time')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local deadline = now + ARGV[2]
local day = math.floor(deadline / 86400000) + 2
local old = redis.pcall('set', KEYS[1], string.format('%.0f:%s:%d:0:%s', deadline, ARGV[3], day, ARGV[1]), 'XX', 'KEEPTTL', 'GET')
if type(old) == 'table' and old.err then
  -- A server older than 6.2 knows no GET for SET: a syntax error. Any
  -- other refusal (OOM under noeviction, a replica's READONLY) is
  -- the server's own, and says so.
  if string.find(old.err, 'syntax error', 1, true) then
    error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
  end
  error(old)
end
local d, token, old_day, waiting, owner
if old then
  d, token, old_day, waiting, owner = string.match(old, '^(%d+):(%d+):(%d+):([012]):(.*)$')
end
if owner ~= ARGV[1] or tonumber(d) <= now then
  if not old then
    return 'g'
  end
  redis.call('set', KEYS[1], old, 'KEEPTTL')
  local mine = ARGV[3]
  if owner == ARGV[1] then
    return 'e'
  elseif owner == '!forced:' .. mine then
    return 'f'
  elseif token and (#token > #mine or (#token == #mine and token > mine)) then
    return 't'
  elseif owner == '' and token == mine then
    return 'r'
  end
  return 'o'
end
local later = tonumber(old_day) < day
if later or token ~= ARGV[3] or waiting ~= '0' then
  local v = string.format('%.0f:%s:%d:%s:%s', deadline, token, day, waiting, owner)
  if later then
    redis.call('set', KEYS[1], v, 'PXAT', day * 86400000)
  else
    redis.call('set', KEYS[1], v, 'KEEPTTL')
  end
end
return day

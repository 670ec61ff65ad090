-- Owner-checked extension of this node's vote, while it has not lapsed
-- (see state.lua, whose format this script reads and writes, with none of
-- its helpers: see acquire.lua).
-- KEYS[1] lock  ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] the lease's token,
-- the node's fence as a rule
--
-- A refresh that is not the owner's to make, or is refused, leaves the key
-- as it was. Its SET is XX: on a node that lost the key (restarted empty,
-- a key deleted by hand) it writes nothing, where a SET would create a key
-- without an expiry, and a DEL to take it back could be refused. A refresh
-- refused PEXPIREAT after its write (an ACL without it) writes the old
-- state back: kept, the extended vote's new day would make the next
-- refresh skip PEXPIREAT and succeed, while the key still expired with its
-- old day, before the lease's Expiry.
local t = redis.call('time')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local deadline = now + ARGV[2]
local day = math.floor(deadline / 86400000) + 2
-- The deadline (13 digits) in two %d parts: see acquire.lua.
local dhi = math.floor(deadline / 1000000)
local dlo = deadline - dhi * 1000000
local old = redis.pcall('set', KEYS[1], string.format('%d%06d:%s:%d:%s', dhi, dlo, ARGV[3], day, ARGV[1]), 'XX', 'KEEPTTL', 'GET')
if type(old) == 'table' and old.err then
  -- A server older than 6.2 knows no GET for SET: a syntax error. Any
  -- other refusal (OOM under noeviction, a replica's READONLY) is
  -- the server's own, and says so.
  if string.find(old.err, 'syntax error', 1, true) then
    error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
  end
  error(old)
end
local d, fence, old_day, owner
if old then
  d, fence, old_day, owner = string.match(old, '^(%d+):(%d+):(%d+):(.*)$')
end
if owner ~= ARGV[1] or tonumber(d) <= now then
  if old then
    redis.call('set', KEYS[1], old, 'KEEPTTL')
  end
  return 0
end
if fence ~= ARGV[3] then
  redis.call('set', KEYS[1], string.format('%d%06d:%s:%d:%s', dhi, dlo, fence, day, owner), 'KEEPTTL')
end
if tonumber(old_day) < day then
  local e = redis.pcall('pexpireat', KEYS[1], day * 86400000)
  if type(e) == 'table' and e.err then
    redis.call('set', KEYS[1], old, 'KEEPTTL')
    error(e)
  end
end
return 1

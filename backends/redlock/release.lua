-- Owner-checked withdrawal of this node's vote: the key stays, free, with
-- the node's fence (see state.lua, whose format this script reads and
-- writes, with none of its helpers: see acquire.lua).
-- KEYS[1] lock  ARGV[1] owner  ARGV[2] the lease's token, the node's fence
-- as a rule  ARGV[3] the key's day as the vote set it, as a rule ('0' when
-- unknown)
--
-- Its SET is XX: on a node that lost the key (restarted empty, a key
-- deleted by hand) it writes nothing, where a SET would create a key
-- without an expiry, and a DEL to take it back could be refused.
--
-- This part runs on every release; the rest only when the state is not the
-- one the client expects, the owner's vote with its token and day. That
-- takes comparisons of strings, where a pattern match costs the server
-- about as much as the rest of such a withdrawal.
local free = '0:' .. ARGV[2] .. ':' .. ARGV[3] .. ':'
local old = redis.pcall('set', KEYS[1], free, 'XX', 'KEEPTTL', 'GET')
if type(old) == 'table' and old.err then
  -- A server older than 6.2 knows no GET for SET: a syntax error. Any
  -- other refusal (OOM under noeviction, a replica's READONLY) is
  -- the server's own, and says so.
  if string.find(old.err, 'syntax error', 1, true) then
    error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
  end
  error(old)
end
if old then
  -- The owner's vote is '<deadline>' (digits, no ':') followed by mine.
  local mine = string.sub(free, 2) .. ARGV[1]
  if string.sub(old, -#mine) == mine and string.find(old, ':', 1, true) == #old - #mine + 1 then
    return 1
  end
end
local fence, day, owner
if old then
  fence, day, owner = string.match(old, '^%d+:(%d+):(%d+):(.*)$')
end
if owner ~= ARGV[1] then
  -- Not the owner's (or another format): what was there is written back.
  if old then
    redis.call('set', KEYS[1], old, 'KEEPTTL')
  end
  return 0
end
redis.call('set', KEYS[1], '0:' .. fence .. ':' .. day .. ':', 'KEEPTTL')
return 1

-- Owner-checked withdrawal of this node's vote: the key stays, free, with
-- the node's fence (see state.lua, whose format this script reads and
-- writes, with none of its helpers: see acquire.lua).
-- KEYS[1] lock  ARGV[1] owner  ARGV[2] the lease's token, the node's fence
-- as a rule  ARGV[3] the key's day as the vote set it ('0' when unknown)
local old = redis.pcall('set', KEYS[1], '0:' .. ARGV[2] .. ':' .. ARGV[3] .. ':', 'KEEPTTL', 'GET')
if type(old) == 'table' and old.err then
  error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
end
local fence, day, owner
if old then
  fence, day, owner = string.match(old, '^%d+:(%d+):(%d+):(.*)$')
end
if owner ~= ARGV[1] then
  -- Not the owner's (or another format): what was there is written back.
  if old then
    redis.call('set', KEYS[1], old, 'KEEPTTL')
  else
    redis.call('del', KEYS[1])
  end
  return 0
end
if fence ~= ARGV[2] or day ~= ARGV[3] then
  redis.call('set', KEYS[1], '0:' .. fence .. ':' .. day .. ':', 'KEEPTTL')
end
return 1

-- Record the token on a node this owner holds, never moving the counter back.
-- Owner-checked: on a node whose vote already lapsed, a later holder may have
-- read the counter, so writing there would prove nothing. Like a fence
-- written by acquire.lua, it expires a day later.
-- KEYS[1] lock  KEYS[2] fence  ARGV[1] owner  ARGV[2] token
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
local token = tonumber(ARGV[2])
if token > tonumber(redis.call('get', KEYS[2]) or '0') then
  redis.call('set', KEYS[2], ARGV[2], 'PX', 86400000)
end
return 1

-- Record the token on a node this owner holds, never moving the counter back.
-- Owner-checked: on a node whose vote already lapsed, a later holder may have
-- read the counter, so writing there would prove nothing.
-- KEYS[1] lock (see state.lua)  ARGV[1] owner  ARGV[2] token
local d, fence, day, owner = parse(redis.call('get', KEYS[1]))
if not d or owner ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) > tonumber(fence) then
  put(KEYS[1], state(d, ARGV[2], day, owner))
end
return 1

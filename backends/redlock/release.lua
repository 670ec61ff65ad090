-- Owner-checked withdrawal of this node's vote: the key stays, free, with
-- the node's fence (see state.lua).
-- KEYS[1] lock  ARGV[1] owner  ARGV[2] the lease's token, the node's fence
-- as a rule  ARGV[3] the key's day as the vote set it ('0' when unknown)
local old = swap(KEYS[1], state(0, ARGV[2], ARGV[3], ''))
local d, fence, day, owner = parse(old)
if not d or owner ~= ARGV[1] then
  restore(KEYS[1], old)
  return 0
end
if fence ~= ARGV[2] or day ~= ARGV[3] then
  put(KEYS[1], state(0, fence, day, ''))
end
return 1

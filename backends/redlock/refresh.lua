-- Owner-checked extension of this node's vote, while it has not lapsed.
-- KEYS[1] lock (see state.lua)  ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] the
-- lease's token, the node's fence as a rule
local us, now = clock()
local deadline = now + tonumber(ARGV[2])
local day = day_of(deadline)
local old = swap(KEYS[1], state(deadline, ARGV[3], day, ARGV[1]))
local d, fence, old_day, owner = parse(old)
if not d or owner ~= ARGV[1] or d <= now then
  restore(KEYS[1], old)
  return 0
end
if fence ~= ARGV[3] then
  put(KEYS[1], state(deadline, fence, day, owner))
end
keep(KEYS[1], old_day, day)
return 1

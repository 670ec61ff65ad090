-- Owner-checked extension of a plain or fair lock (see state.lua): only a
-- lease still the owner's and not yet expired is extended.
-- KEYS[1] lock  ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] its token
-- Returns the key's day when extended, 0 when the lock was not owner's.
local us, now = clock()
local deadline = now + tonumber(ARGV[2])
local day = day_of(deadline)
local old = swap(KEYS[1], state(deadline, ARGV[3], day, '0', ARGV[1]))
local d, token, old_day, waiting, owner = parse(old)
if not d or owner ~= ARGV[1] or d <= now then
  restore(KEYS[1], old)
  return 0
end
if token ~= ARGV[3] or waiting ~= '0' then
  put(KEYS[1], state(deadline, token, day, waiting, owner))
end
keep(KEYS[1], old_day, day)
return tonumber(day)

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
-- Returns {1, fence before, 1 if the proposal was recorded else 0, day} or
-- {0, holder's pttl}.
local us, now = clock()
local deadline = now + tonumber(ARGV[2])
local day = day_of(deadline)
local proposed = tonumber(ARGV[3])
local acceptable = proposed > us and proposed <= us + tonumber(ARGV[4])
local written = us
if acceptable then
  written = proposed
end
local old = swap(KEYS[1], state(deadline, fmt(written), day, ARGV[1]))
local d, stored, old_day, owner = parse(old)
if old and not (d and (d <= now or owner == ARGV[1])) then
  -- Another owner's vote, or a value of another format (an earlier
  -- warden's vote, with PX): it stays as it was.
  put(KEYS[1], old)
  if d then
    return {0, d - now}
  end
  return {0, redis.call('pttl', KEYS[1])}
end
local fence = us
if stored and tonumber(stored) > us then
  fence = tonumber(stored)
end
local recorded = acceptable and proposed > fence
if not recorded and written ~= fence then
  -- The counter never moves back.
  put(KEYS[1], state(deadline, fmt(fence), day, ARGV[1]))
end
keep(KEYS[1], old_day, day)
if recorded then
  return {1, fence, 1, tonumber(day)}
end
return {1, fence, 0, tonumber(day)}

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
-- after it was last written: it is never more than the bound ahead of the
-- clock when written, so the clock alone is past it a day later, unless
-- the node's clock was stepped back by nearly a day meanwhile.
-- KEYS[1] lock  KEYS[2] fence  ARGV[1] owner  ARGV[2] ttl (ms)
-- ARGV[3] proposed token  ARGV[4] bound on its lead over the clock (µs)
-- Returns {1, fence before, 1 if the proposal was recorded else 0} or
-- {0, holder's pttl}.
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return {0, redis.call('pttl', KEYS[1])}
  end
  redis.call('pexpire', KEYS[1], ARGV[2])
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = math.max(tonumber(redis.call('get', KEYS[2]) or '0'), now)
local proposed = tonumber(ARGV[3])
if proposed > fence and proposed <= now + tonumber(ARGV[4]) then
  redis.call('set', KEYS[2], ARGV[3], 'PX', 86400000)
  return {1, fence, 1}
end
return {1, fence, 0}

-- Take this node's vote for the lock if it is free, in one step, and report
-- the node's fence: its counter, or its clock in microseconds when that is
-- greater, so that the client computes a token above every token issued
-- before even when nodes lost their counters (restarted without
-- persistence), as long as their clocks do not run behind by more than the
-- time they were away.
-- KEYS[1] lock  KEYS[2] fence  ARGV[1] owner  ARGV[2] ttl (ms)
-- Returns {1, fence} or {0, holder's pttl}.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return {1, math.max(tonumber(redis.call('get', KEYS[2]) or '0'), now)}
end
return {0, redis.call('pttl', KEYS[1])}

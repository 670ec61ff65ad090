-- next_token moves the fence past both its last value and the server's
-- clock in microseconds, and returns the new token. The clock is what keeps
-- tokens growing when the counter itself is lost: a failover to a replica
-- that missed the last grants, or a restart without persistence, starts
-- again from the new server's clock, which is past every token issued
-- before unless that server's clock is behind the old one's by more than
-- the time the failover took. A Lua number holds integers exactly up to
-- 2^53, which microseconds reach in the year 2255.
local function next_token(fence)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = math.max(tonumber(redis.call('get', fence) or '0') + 1, now)
  redis.call('set', fence, string.format('%.0f', token))
  return token
end

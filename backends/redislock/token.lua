-- next_token moves the fence past both its last value and the server's
-- clock in microseconds, and returns the new token. The clock is what keeps
-- tokens growing when the counter itself is lost: a failover to a replica
-- that missed the last grants, or a restart without persistence, starts
-- again from the new server's clock, which is past every token issued
-- before unless that server's clock is behind the old one's by more than
-- the time the failover took. A Lua number holds integers exactly up to
-- 2^53, which microseconds reach in the year 2255.
--
-- The fence expires fence_retention_ms after the key's last grant, so that
-- lock names used once do not stay in Redis for ever. A token never depends
-- on an expired fence: every token is at most the clock of its grant (a
-- grant takes more than a microsecond), so the clock alone, a day later, is
-- past it, unless the server's clock was stepped back by more than a day
-- in between. A lease held longer than that is no exception: the next
-- grant draws from the clock too.
local fence_retention_ms = 86400000
local function next_token(fence)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = math.max(tonumber(redis.call('get', fence) or '0') + 1, now)
  redis.call('set', fence, string.format('%.0f', token), 'PX', fence_retention_ms)
  return token
end

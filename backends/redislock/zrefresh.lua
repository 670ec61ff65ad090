-- Owner-checked extension of a lease kept in a sorted set (reader, permit).
-- KEYS[1] zset  ARGV[1] owner  ARGV[2] ttl (ms)
-- Returns 1 when extended, 0 when not held (absent or past its deadline).
-- A refused call (an ACL user without PEXPIRE) fails the script with the
-- deadline where it was (see add_member).
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = redis.call('zscore', KEYS[1], ARGV[1])
if (not deadline) or tonumber(deadline) <= now then
  return 0
end
add_member(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
return 1

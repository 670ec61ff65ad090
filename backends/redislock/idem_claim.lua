-- Claim an idempotency record for an owner when there is no live one. A
-- record is live until the deadline it carries, on the server's clock; the
-- key's PEXPIRE only reclaims memory and may lag.
-- KEYS[1] record (hash)  ARGV[1] owner  ARGV[2] fingerprint  ARGV[3] lease (ms)
-- Returns 0 when claimed, else the live record {state, fingerprint, owner, response}.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = redis.call('hget', KEYS[1], 'deadline')
if deadline and tonumber(deadline) > now then
  return redis.call('hmget', KEYS[1], 'state', 'fingerprint', 'owner', 'response')
end
local lease = tonumber(ARGV[3])
redis.call('del', KEYS[1])
redis.call('hset', KEYS[1], 'state', 'in_progress', 'fingerprint', ARGV[2], 'owner', ARGV[1], 'deadline', now + lease)
redis.call('pexpire', KEYS[1], lease)
return 0

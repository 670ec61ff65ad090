-- Read a live idempotency record (deadline on the server's clock).
-- KEYS[1] record (hash)
-- Returns the record {state, fingerprint, owner, response}, or 0.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = redis.call('hget', KEYS[1], 'deadline')
if deadline and tonumber(deadline) > now then
  return redis.call('hmget', KEYS[1], 'state', 'fingerprint', 'owner', 'response')
end
return 0

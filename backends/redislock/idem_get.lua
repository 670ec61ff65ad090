-- Read a live idempotency record: one whose key has not expired.
-- KEYS[1] record (hash)
-- Returns the record {state, fingerprint, owner, response}, or 0.
-- It runs read-only (EVALSHA_RO, see scripter.runReadOnly): it must write
-- nothing.
local r = redis.call('hmget', KEYS[1], 'state', 'fingerprint', 'owner', 'response')
if r[1] then
  return r
end
return 0

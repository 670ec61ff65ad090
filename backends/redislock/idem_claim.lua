-- Claim an idempotency record for an owner when there is no live one. A
-- record lives as long as its key: the key's expiry, counted by Redis on its
-- own clock, is the claim's lease, then the completed record's retention,
-- as PX is a lock's lease. The deadline field is for processes of earlier
-- versions, which compare it with the server's clock: set past any clock,
-- it leaves liveness to the key's expiry for them too.
-- KEYS[1] record (hash)  ARGV[1] owner  ARGV[2] fingerprint  ARGV[3] lease (ms)
-- Returns 0 when claimed, else the live record {state, fingerprint, owner, response}.
local r = redis.call('hmget', KEYS[1], 'state', 'fingerprint', 'owner', 'response')
if r[1] then
  return r
end
redis.call('hset', KEYS[1], 'state', 'in_progress', 'fingerprint', ARGV[2], 'owner', ARGV[1], 'deadline', '9007199254740991')
-- A hash takes no expiry with its fields: a PEXPIRE refused after the
-- HSET (an ACL user without it) takes the claim back, or it would stay,
-- in progress for good, and refuse every later request with its key.
local e = redis.pcall('pexpire', KEYS[1], ARGV[3])
if type(e) == 'table' and e.err then
  redis.call('del', KEYS[1])
  error(e)
end
return 0

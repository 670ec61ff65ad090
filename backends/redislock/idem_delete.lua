-- Delete an idempotency record for an operator, only while its owner is the
-- one they were shown: a record claimed or completed by another since is
-- left.
-- KEYS[1] record (hash)  ARGV[1] owner, or '' for whoever owns it
-- Returns 1 when deleted, 0 when the record is another owner's, -1 when
-- there is none.
local owner = redis.call('hget', KEYS[1], 'owner')
if not owner then
  return -1
end
if ARGV[1] ~= '' and owner ~= ARGV[1] then
  return 0
end
redis.call('del', KEYS[1])
return 1

-- add_member writes member into set with a deadline ttl ms after now
-- (server clock), and makes the set last as long. A script is not rolled
-- back: a call refused after the member's write (an ACL user without
-- PEXPIRE) would leave the member in the name of a caller told that it
-- failed, a permit or a read hold, or a writer's wait keeping readers out,
-- until its deadline, or a refreshed deadline its holder was told was not.
-- So the expiry of a set that exists is moved first, the member written
-- after it: a refused ZADD then leaves only a later expiry, which the
-- members' own deadlines make no matter. A new set has no expiry to move
-- before its first member: that member is taken back when its expiry is
-- refused, which deletes the set again.
local function add_member(set, member, now, ttl)
  local pttl = redis.call('pttl', set)
  if pttl ~= -2 then
    if pttl < ttl then
      redis.call('pexpire', set, ttl)
    end
    redis.call('zadd', set, now + ttl, member)
    return
  end
  redis.call('zadd', set, now + ttl, member)
  local e = redis.pcall('pexpire', set, ttl)
  if type(e) == 'table' and e.err then
    redis.call('zrem', set, member)
    error(e)
  end
end

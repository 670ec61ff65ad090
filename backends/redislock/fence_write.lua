-- The fenced writes of Fence, after fence_check.lua: ARGV[1] names the
-- write, KEYS and the rest of ARGV are its own.
local op = ARGV[1]
if op == 'set' then
  if ARGV[3] ~= '0' then
    return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  end
  return redis.call('SET', KEYS[1], ARGV[2])
elseif op == 'del' then
  return redis.call('DEL', unpack(KEYS))
elseif op == 'hset' then
  return redis.call('HSET', KEYS[1], unpack(ARGV, 2))
elseif op == 'incrby' then
  return redis.call('INCRBY', KEYS[1], ARGV[2])
end
return 0

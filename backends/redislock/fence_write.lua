-- The fenced writes of Fence, after fence_check.lua: ARGV[1] names the
-- write, KEYS and the rest of ARGV are its own. The write comes first: when
-- Redis refuses it (WRONGTYPE, a value that is not an integer), the script
-- stops there and the fence does not move.
local op = ARGV[1]
local r = 0
if op == 'set' then
  if ARGV[3] ~= '0' then
    r = redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  else
    r = redis.call('SET', KEYS[1], ARGV[2])
  end
elseif op == 'del' then
  r = redis.call('DEL', unpack(KEYS))
elseif op == 'hset' then
  r = redis.call('HSET', KEYS[1], unpack(ARGV, 2))
elseif op == 'incrby' then
  r = redis.call('INCRBY', KEYS[1], ARGV[2])
end
warden_advance()
return r

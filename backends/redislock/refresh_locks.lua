-- Owner-checked extension of many plain or fair locks in one script, each
-- as refresh_lock.lua extends one: a batch sends one command per chunk of
-- leases instead of one per lease, so the client builds, keeps until the
-- answer and parses one command per chunk, and the server reads its clock
-- once per chunk.
-- KEYS the locks  ARGV[1] ttl (ms)  ARGV[2i], ARGV[2i+1] the owner and the
-- token of KEYS[i]
-- Returns {day, flags}: the day every extended key now has, and one
-- character per key, '1' when it was extended, else the letter
-- refresh_lock.lua answers for why not.
-- Each key as in refresh_lock.lua: a state that was not the owner's is
-- written back as the next write after the SET GET that read it, a key
-- that is gone stays gone (XX), and a later day is set with the state.
local t = redis.call('time')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local deadline = now + ARGV[1]
local day = math.floor(deadline / 86400000) + 2
local flags = {}
for i, key in ipairs(KEYS) do
  local mine, token = ARGV[2 * i], ARGV[2 * i + 1]
  local old = redis.pcall('set', key, string.format('%.0f:%s:%d:0:%s', deadline, token, day, mine), 'XX', 'KEEPTTL', 'GET')
  if type(old) == 'table' and old.err then
    -- A server older than 6.2 knows no GET for SET: a syntax error. Any
    -- other refusal (OOM under noeviction, a replica's READONLY) is
    -- the server's own, and says so.
    if string.find(old.err, 'syntax error', 1, true) then
      error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
    end
    error(old)
  end
  local d, held, old_day, waiting, owner
  if old then
    d, held, old_day, waiting, owner = string.match(old, '^(%d+):(%d+):(%d+):([012]):(.*)$')
  end
  if owner ~= mine or tonumber(d) <= now then
    if not old then
      flags[i] = 'g'
    else
      redis.call('set', key, old, 'KEEPTTL')
      if owner == mine then
        flags[i] = 'e'
      elseif owner == '!forced:' .. token then
        flags[i] = 'f'
      elseif held and (#held > #token or (#held == #token and held > token)) then
        flags[i] = 't'
      elseif owner == '' and held == token then
        flags[i] = 'r'
      else
        flags[i] = 'o'
      end
    end
  else
    local later = tonumber(old_day) < day
    if later or held ~= token or waiting ~= '0' then
      local v = string.format('%.0f:%s:%d:%s:%s', deadline, held, day, waiting, owner)
      if later then
        redis.call('set', key, v, 'PXAT', day * 86400000)
      else
        redis.call('set', key, v, 'KEEPTTL')
      end
    end
    flags[i] = '1'
  end
end
return {day, table.concat(flags)}

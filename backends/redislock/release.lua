-- The rest of the release (see release_head.lua, which runs first and
-- leaves old, the state it replaced, and given, the waiting flag its
-- grant found).
local waiters = KEYS[4] or KEYS[2]
local token, day, waiting, owner
if old then
  token, day, waiting, owner = string.match(old, '^%d+:(%d+):(%d+):([012]):(.*)$')
end
if owner ~= ARGV[1] then
  -- Not the owner's (or another format): what was there is written back.
  if old then
    redis.call('set', KEYS[1], old, 'KEEPTTL')
  else
    redis.call('del', KEYS[1])
  end
  return 0
end
if waiting == '2' and not KEYS[4] then
  redis.call('set', KEYS[1], old, 'KEEPTTL')
  return -1
end
local flag = '0'
local next, score, now, us = ''
if waiting ~= '0' then
  next, score, now, us = next_waiter(KEYS[2], KEYS[3], waiters, waiting == '1', true)
  if next ~= '' then
    flag = waiting
  end
end
if score then
  -- A record '<channel>\n<ttl>\n<owner>'; an earlier version's has no ttl.
  local channel, px, who = string.match(next, '^([^\n]*)\n(%d+)\n(.*)$')
  if px then
    local tk = tonumber(token)
    if tk >= us then
      tk = tk + 1
    else
      tk = us
    end
    local deadline = now + px
    local new_day = math.floor(deadline / 86400000) + 2
    -- A %.0f costs the server more than a command: the token is
    -- formatted once, and the deadline as two %d parts (a C long, 32 bits
    -- on some builds; see acquire.lua).
    tk = string.format('%.0f', tk)
    local dhi = math.floor(deadline / 1000000)
    -- The flag stays: the release of this grant looks for more waiters.
    redis.call('set', KEYS[1], string.format('%d%06d:%s:%d:%s:%s', dhi, deadline - dhi * 1000000, tk, new_day, flag, who), 'KEEPTTL')
    if tonumber(day) < new_day then
      redis.call('pexpireat', KEYS[1], new_day * 86400000)
    end
    redis.call('publish', channel, string.format('=%s:%d:%s\n', tk, new_day, flag) .. next)
    return 2
  end
  -- Its waiter takes it out when it gets the lock.
  redis.call('zadd', waiters, score, next)
end
if token ~= ARGV[2] or day ~= ARGV[3] or flag ~= given then
  redis.call('set', KEYS[1], '0:' .. token .. ':' .. day .. ':' .. flag .. ':', 'KEEPTTL')
end
if next ~= '' then
  -- '{<key>}:lock' gives '{<key>}:released'.
  wake(ARGV[4] or (string.sub(KEYS[1], 1, -5) .. 'released'), next)
end
return 1

-- Owner-checked release: a lease that expired and was taken over must not
-- free the new owner's lock. The lock's state stays, free, with its token
-- (see state.lua, whose format this script reads and writes, with none of
-- its helpers: see acquire.lua). When a waiter announced itself, the
-- release message names one waiter, so that only it retries: the next live
-- fair waiter, else the non-fair waiter whose record was renewed longest
-- ago. A non-fair waiter whose record says its TTL is not told to retry but handed the
-- lock: the release grants it in the waiter's name, and the message tells
-- it its token (see wait.go for the deadline the waiter counts), so that
-- the lock reaches it in this one round trip, and the releaser, coming
-- straight back for it, finds it held instead of taking it again while the
-- waiter it woke is on its way.
-- KEYS[1] lock  KEYS[2] queue  KEYS[3] deadlines  KEYS[4] waiters (zset)
-- ARGV[1] owner  ARGV[2] its token  ARGV[3] its day  ARGV[4] channel
-- ARGV[5] the waiting flag its grant found, which the free state keeps
-- while someone waits (token, day and flag may be '0' when unknown: the
-- state then gives them)
-- Returns 1 when released, 2 when released and handed to a waiter, 0 when
-- the lock was not owner's.
local old = redis.pcall('set', KEYS[1], '0:' .. ARGV[2] .. ':' .. ARGV[3] .. ':' .. ARGV[5] .. ':', 'KEEPTTL', 'GET')
if type(old) == 'table' and old.err then
  error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
end
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
local flag = '0'
local next, score, now, us = ''
if waiting ~= '0' then
  next, score, now, us = next_waiter(KEYS[2], KEYS[3], KEYS[4], waiting == '1', true)
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
    -- The flag stays: the release of this grant looks for more waiters.
    redis.call('set', KEYS[1], string.format('%.0f:%.0f:%d:%s:%s', deadline, tk, new_day, flag, who), 'KEEPTTL')
    if tonumber(day) < new_day then
      redis.call('pexpireat', KEYS[1], new_day * 86400000)
    end
    redis.call('publish', channel, string.format('=%.0f:%d:%s\n', tk, new_day, flag) .. next)
    return 2
  end
  -- Its waiter takes it out when it gets the lock.
  redis.call('zadd', KEYS[4], score, next)
end
if token ~= ARGV[2] or day ~= ARGV[3] or flag ~= ARGV[5] then
  redis.call('set', KEYS[1], '0:' .. token .. ':' .. day .. ':' .. flag .. ':', 'KEEPTTL')
end
if next ~= '' then
  wake(ARGV[4], next)
end
return 1

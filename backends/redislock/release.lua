-- Owner-checked release: a lease that expired and was taken over must not
-- free the new owner's lock. The lock's state stays, free, with its token
-- (see state.lua, whose format this script reads and writes, with none of
-- its helpers: see acquire.lua). When a waiter announced itself, the
-- release message names one waiter, so that only it retries: the next live
-- fair waiter, else the non-fair waiter recorded longest ago.
-- KEYS[1] lock  KEYS[2] queue  KEYS[3] deadlines  KEYS[4] waiters (zset)
-- ARGV[1] owner  ARGV[2] its token  ARGV[3] its day  ARGV[4] channel
-- ARGV[5] the waiting flag its grant found, which the free state keeps
-- while someone waits (token, day and flag may be '0' when unknown: the
-- state then gives them)
-- Returns 1 when released, 0 when the lock was not owner's.
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
local next = ''
if waiting ~= '0' then
  next = next_waiter(KEYS[2], KEYS[3], KEYS[4], waiting == '1')
  if next ~= '' then
    flag = waiting
  end
end
if token ~= ARGV[2] or day ~= ARGV[3] or flag ~= ARGV[5] then
  redis.call('set', KEYS[1], '0:' .. token .. ':' .. day .. ':' .. flag .. ':', 'KEEPTTL')
end
if next ~= '' then
  wake(ARGV[4], next)
end
return 1

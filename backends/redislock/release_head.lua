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
-- KEYS[1] lock  KEYS[2] queue  KEYS[3] deadlines  KEYS[4] waiters (zset);
-- or KEYS[1] lock  KEYS[2] waiters, from a plain lock's holder whose grant
-- found no fair waiter announced: each key or argument costs the server
-- about as much as a command to hand to the script, and the queue's are
-- needed only once a fair waiter announced itself on the lock.
-- ARGV[1] owner  ARGV[2] its token  ARGV[3] its day  ARGV[4] channel
-- ARGV[5] the waiting flag its grant found, which the free state keeps
-- while someone waits (token, day and flag may be '0' when unknown: the
-- state then gives them); with two keys, the first three, and the flag as
-- ARGV[4] when it is '1' ('0' without it); the channel is the lock's. Or,
-- with two keys, from a holder whose grant found nobody waiting, two
-- arguments the client makes: ARGV[1] the free state the release writes,
-- '0:<token>:<day>:0:', and ARGV[2] what the owner's state ends with,
-- ':<token>:<day>:0:<owner>' (each argument costs the server 1-1.5k
-- instructions to hand to the script, a concatenation a few hundred).
-- Returns 1 when released, 2 or more when released and handed to a waiter
-- (the server's clock in ms when the grant was made as the lock's first
-- write, see below) or reserved for the head of the fair queue (the
-- server's clock in ms when the reservation was made), 0 when the lock was
-- not owner's, -1 (having changed nothing) when a fair waiter announced
-- itself and the script was not given the queue's keys.
--
-- This part runs on every release; the rest of the script, and its helpers
-- (closures made when their definition runs), only when the state is not
-- the one it expects: held by the owner with its token and day and nobody
-- waiting. That takes comparisons of strings, where a pattern match costs
-- the server more than the rest of such a release.
--
-- Its SET GET, and release.lua's, are XX: a key that is gone (deleted by
-- hand, a restart without persistence) stays gone, where a SET would
-- create it without an expiry, and a DEL to take it back could be refused
-- (an ACL user without DEL).
local my_owner, my_token, my_day = ARGV[1], ARGV[2], ARGV[3]
local given, free, mine = '0', ARGV[1], ARGV[2]
if my_day then
  given = (KEYS[4] and ARGV[5]) or ARGV[4] or '0'
  -- The free state is '0' and tail; the owner's ends with tail and the
  -- owner (two concatenations cost the server less than a string.sub).
  local tail = ':' .. my_token .. ':' .. my_day .. ':' .. given .. ':'
  free, mine = '0' .. tail, tail .. my_owner
end
-- A plain lock whose grant found non-fair waiters is likely handed to one
-- of them: release.lua looks for one first, and writes the grant, or the
-- free state, in the one SET GET that also reads the state to check.
local handing = given == '1' and not KEYS[4]
-- A lock whose grant found a fair waiter announced, released with the
-- queue's keys, is likely reserved for the head of the queue: release.lua
-- looks for it first, and writes the reservation (see there), or the free
-- state, in the one SET GET that also reads the state to check.
local reserving = given == '2' and KEYS[4] ~= nil
local old
if not handing and not reserving then
  old = redis.pcall('set', KEYS[1], free, 'XX', 'KEEPTTL', 'GET')
  if type(old) == 'table' and old.err then
    -- A server older than 6.2 knows no GET for SET: a syntax error. Any
    -- other refusal (OOM under noeviction, a replica's READONLY) is
    -- the server's own, and says so.
    if string.find(old.err, 'syntax error', 1, true) then
      error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
    end
    error(old)
  end
end
if given == '0' and old then
  -- The owner's state is '<deadline>' (digits, no ':') followed by mine.
  local at = #old - #mine
  if at > 0 and string.sub(old, at + 1) == mine and string.find(old, ':', 1, true) == at + 1 then
    return 1
  end
end
-- The rest needs the owner, token and day the client packed; false, which
-- is nobody's owner, when mine is not as the client makes it.
if not my_day then
  my_token, my_day, my_owner = string.match(mine, '^:(%d+):(%d+):0:(.*)$')
  my_owner = my_owner or false
end

-- Take the lock if it is free, in one step, and draw its fencing token
-- (see state.lua, whose format this script reads and writes). A waiting
-- contender that fails records itself among the lock's waiters, with a
-- deadline it renews by trying again, and marks the lock's state, so that
-- its release wakes one of them, in whichever process, instead of all.
-- KEYS[1] lock  KEYS[2] waiters (zset)
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] '0' for a contender that does
-- not wait, '1' for one to record when not acquired, '2' for one recorded
-- before, whose record is to be renewed, '3' for one recorded lately, '4'
-- as '1' for one that just handed the lock to a waiter
-- ARGV[4] the waiter timeout (ms), a newline, and its record: its
-- Locker's wake-up channel, a newline, its TTL (ms), a newline, the owner
-- (see wake in next_waiter.lua, and release.lua, which hands the lock to a
-- record); one argument, taken apart only by an attempt that needs it
-- ARGV[5] '1' when an earlier attempt of the contender got no answer
-- (the trailing arguments this script does not read may be left out: the
-- fifth when it would be '0', and the fourth too in mode '0'; in mode '0'
-- with no fifth, the mode and KEYS[2] too, which such an attempt does not
-- touch: each key or argument costs the server 1-1.5k instructions to hand
-- to the script, a command's worth)
-- Returns the token alone (a string of digits, which costs the server no
-- number formatting) for a grant that found nobody waiting, the common
-- case, else {1, token, day, waiting flag}; {0, holder's pttl, its token
-- (digits too)} when not acquired ({0, pttl} for another format's lock,
-- which has no token). (A table costs the server more to answer than the rest of a
-- grant's bookkeeping; the client works the day out from its own clock,
-- which the release only uses to spare a write: see lease.go.)
--
-- This script runs on every acquisition, so it spends little: it uses none
-- of state.lua's helpers (a helper is a closure made on every run), and it
-- keeps the clock's microseconds, the token and the deadline as the
-- strings they come as or go out as wherever it can: with the C library
-- Redis links, a tonumber costs about 2k instructions, a %.0f of a
-- 16-digit number about 6k, against a few hundred for a concatenation or a
-- comparison of strings; a call of a library function (math.floor,
-- string.sub) about 1k, where arithmetic on digits, which Lua converts
-- itself, and %, which is floor division's remainder, cost less. %d takes
-- a C long, which a 32-bit build of Redis would cut short past 2^31, so
-- the deadline (13 digits) is written as two %d parts and the token as
-- digits.
--
-- Tokens and clocks compared as strings are decimal digits without leading
-- zeros: the longer is the greater, and of equal lengths the one that
-- sorts after (Lua compares strings with strcoll, which orders digits as
-- numbers in every locale).
local t = redis.call('time')
local sec, usec = t[1], t[2]
-- The clock in microseconds, as digits (TIME answers the microseconds
-- without leading zeros), and in milliseconds, as a number. Every number
-- here is a whole number below 2^53, which a double holds exactly, and so
-- do its quotients by 10^6 and 86400000 once the remainder is taken off.
local us = sec .. string.sub('00000', #usec) .. usec
local now = sec * 1000 + (usec - usec % 1000) / 1000
local deadline = now + ARGV[2]
local day = (deadline - deadline % 86400000) / 86400000 + 2
local dlo = deadline % 1000000
local dhi = (deadline - dlo) / 1000000
local mode = ARGV[3] or '0'
local recorded = mode == '2' or mode == '3'
-- A contender that comes back after waiting, or right after its release
-- handed the lock to a waiter, is likely to find the lock taken: it reads
-- the state before writing, where the others, likely to find the lock
-- free, write theirs at once and read the old one with it.
local swapped = mode == '0' or mode == '1'
local old, written
if swapped then
  written = string.format('%d%06d:%s:%d:0:%s', dhi, dlo, us, day, ARGV[1])
  old = redis.pcall('set', KEYS[1], written, 'KEEPTTL', 'GET')
  if type(old) == 'table' and old.err then
    -- A server older than 6.2 knows no GET for SET: a syntax error. Any
    -- other refusal (OOM under noeviction, a replica's READONLY) is
    -- the server's own, and says so.
    if string.find(old.err, 'syntax error', 1, true) then
      error({err = 'warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ' .. old.err})
    end
    error(old)
  end
else
  old = redis.call('get', KEYS[1])
end
local d, token, old_day, waiting, owner
local free = not old
if old then
  d, token, old_day, waiting, owner = string.match(old, '^(%d+):(%d+):(%d+):([012]):(.*)$')
  -- A released lock's deadline is 0: no conversion.
  if d == '0' then
    d, free = 0, true
  elseif d then
    d = d + 0
    free = d <= now
  end
end
-- A release may have handed the lock to the waiting contender, whose
-- message got lost or is yet to come, or an attempt whose answer never came
-- may have taken it: it is the contender's then, with the token drawn for
-- it, which nobody can have moved since, and this attempt extends it.
local mine = d ~= nil and not free and owner == ARGV[1]
if free or mine then
  local tk = us
  if mine then
    tk = token
  elseif token and (#token > #us or (#token == #us and token >= us)) then
    -- Past the last token, and not below the clock, which is what keeps
    -- tokens growing when the state is lost. The clock is behind the last
    -- token only when it was stepped back, or within a microsecond.
    tk = string.format('%.0f', tonumber(token) + 1)
  end
  -- A waiter's record goes once the lock is its own: before the grant is
  -- written when nothing is yet, so that a refused ZREM (an ACL user
  -- without it) writes nothing, else after the grant's last write.
  local unrecord = (recorded or ARGV[5] == '1') and string.sub(ARGV[4], string.find(ARGV[4], '\n', 1, true) + 1)
  if unrecord and not swapped then
    redis.call('zrem', KEYS[2], unrecord)
  end
  -- Other waiters may still wait: the flag stays until a release finds
  -- none.
  waiting = waiting or '0'
  -- The key expires at the end of day, moved once a day for a key in
  -- constant use, by the SET of the state itself: a PEXPIREAT after it,
  -- refused (an ACL user without it), would stop the script with the
  -- state's day written and the key's old expiry (none, for a key the SET
  -- GET created), and the next grant, finding the day, would not move it.
  -- After the SET GET, this SET is refused no more than it was: the same
  -- command on the same key, and a script that wrote is not refused more
  -- writes for memory.
  local later = not old_day or old_day - day < 0
  local rewrite = not swapped or tk ~= us or waiting ~= '0'
  if later or rewrite then
    local v = written
    if rewrite then
      v = string.format('%d%06d:%s:%d:%s:%s', dhi, dlo, tk, day, waiting, ARGV[1])
    end
    if later then
      redis.call('set', KEYS[1], v, 'PXAT', day * 86400000)
    else
      redis.call('set', KEYS[1], v, 'KEEPTTL')
    end
  end
  if unrecord and swapped then
    redis.call('zrem', KEYS[2], unrecord)
  end
  if waiting == '0' then
    return tk
  end
  return {1, tk, day, (waiting == '1' and 1) or 2}
end
-- Held by another: the holder's state is written back (with the waiting
-- flag) as the next write, before the record: a script is not rolled back,
-- and a command that fails it after the SET GET (a record refused) must
-- not leave this contender's grant over the holder's.
local flag = waiting
if mode ~= '0' and waiting ~= '2' then
  -- Announced: '1' for a non-fair waiter, unless a fair one did ('2').
  flag = '1'
end
if not d then
  -- Another format: an earlier warden's lock, with its own expiry.
  if swapped then
    redis.call('set', KEYS[1], old, 'KEEPTTL')
  end
elseif flag ~= waiting then
  redis.call('set', KEYS[1], string.format('%.0f:%s:%s:%s:%s', d, token, old_day, flag, owner), 'KEEPTTL')
elseif swapped then
  redis.call('set', KEYS[1], old, 'KEEPTTL')
end
if mode ~= '0' and mode ~= '3' then
  local nl = string.find(ARGV[4], '\n', 1, true)
  local timeout = tonumber(string.sub(ARGV[4], 1, nl - 1))
  redis.call('zadd', KEYS[2], now + timeout, string.sub(ARGV[4], nl + 1))
  -- The records outlive no waiter that renews its own; an expiry moved
  -- to twice the timeout lasts through the records of the timeout that
  -- follows, so that most records cost no PEXPIRE.
  if redis.call('pttl', KEYS[2]) < timeout then
    redis.call('pexpire', KEYS[2], 2 * timeout)
  end
end
if not d then
  return {0, redis.call('pttl', KEYS[1])}
end
-- The holder's token tells a waiter whether a grant it hears of later was
-- made after this attempt ran (see handedOver in wait.go).
return {0, d - now, token}

-- The first attempt of a contender whose Locker's latest release of the
-- lock handed it to a waiter a moment ago (see release.lua), and which
-- comes straight back: the lock is most likely held by the waiter it went
-- to, so the contender records itself among the waiters and is refused,
-- as acquire.lua would, but with the server's clock of that release in
-- place of TIME, and without writing the state, whose waiting flag the
-- grant left set. The state is still read, so that a lock freed since
-- (the waiter already done with it) is not taken for held, which would
-- leave the contender waiting for a release that has come and gone.
-- KEYS[1] lock  KEYS[2] waiters (zset)
-- ARGV[1] owner  ARGV[2] its record (see acquire.lua)  ARGV[3] the
-- server's clock (ms) at that release  ARGV[4] that plus the waiter
-- timeout, the record's score  ARGV[5] waiter timeout (ms)
-- Returns {0, the holder's deadline (ms, server clock), its token}, having
-- recorded the contender (the client takes the clock it sent from the
-- deadline for acquire.lua's refusal, whose second value is the pttl);
-- {-1, 0}, having changed nothing, when the state is not held by another
-- owner until past that clock with the waiting flag set: acquire.lua
-- decides then.
--
-- The clock given is behind the server's by the time since that release:
-- a lease that ran out meanwhile is taken for held, which refuses a free
-- lock (never grants a held one), and the contender, told the lease has
-- that little left, tries again when it would have run out; and the record
-- lapses that much early. The client sends the clock only for an attempt
-- right after the release (see plainContender.attempt).
--
-- The deadline and the clock are compared as digits, and the score comes
-- made, so that no number is converted but the timeout (see acquire.lua).
local old = redis.call('get', KEYS[1])
if old then
  local d, token, waiting, owner = string.match(old, '^(%d+):(%d+):%d+:([012]):(.*)$')
  local now = ARGV[3]
  if d and waiting ~= '0' and owner ~= ARGV[1] and (#d > #now or (#d == #now and d > now)) then
    redis.call('zadd', KEYS[2], ARGV[4], ARGV[2])
    -- As acquire.lua keeps the records' expiry.
    local timeout = tonumber(ARGV[5])
    if redis.call('pttl', KEYS[2]) < timeout then
      redis.call('pexpire', KEYS[2], 2 * timeout)
    end
    return {0, d, token}
  end
end
return {-1, 0}

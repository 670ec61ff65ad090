-- Fair acquisition: the lock goes to the oldest live waiter. Each waiter has
-- a place in a list and a deadline (server clock) in a sorted set; a waiter
-- that stops coming back (crashed) loses its place when its deadline passes.
-- A place is named '<waiter timeout>:<channel of its Locker>\n<owner>', so
-- that anyone can tell when its waiter, which renews it every third of its
-- timeout, is late, and the messages for it go to its process alone (see
-- wake).
--
-- A release that finds a live head reserves the lock for it: it grants it
-- in the head's owner's name for the head's handoff window, and wakes it;
-- the head claims it at once, extending the grant to its TTL, and nobody
-- else takes it meanwhile. A free lock that the head of the queue leaves
-- unclaimed tells of a head that is gone: a live head is woken by the
-- release (or by its own timer, when the lease expired) and claims at
-- once. So:
--   * a head whose reservation lapsed without its claim, nor a renewal of
--     its place since, is dropped at once, as is a head late renewing its
--     place (a live one only goes to the back of the queue), and so is the
--     next, while late;
--   * a head on time has a handoff window to claim the lock; whoever finds
--     the lock free behind it comes back when the window ends.
-- A head dropped, a place lapsed, or a waiter whose place vanished although
-- it kept it renewed, while the lock is free, says the queue may hold more
-- waiters that are gone. After a failover to a replica that missed the
-- latest grants, the waiters those grants let in are all still queued, ahead
-- of the live ones, whose places were lost with the grants. Every waiter
-- that has not confirmed its place lately is then told to confirm it within
-- the window: the live ones do at once (any attempt renews a place), so the
-- dead are dropped together rather than one window each.
-- KEYS[1] lock  KEYS[2] queue (list)  KEYS[3] deadlines (zset)
-- ARGV[1] owner  ARGV[2] ttl (ms)  ARGV[3] '1' to queue when not acquired,
-- '2' when the contender had a place already  ARGV[4] waiter timeout (ms)
-- ARGV[5] handoff window (ms)  ARGV[6] channel  ARGV[7] the contender's place
-- ARGV[8], for the first attempt of a contender whose Locker's release of
-- the lock reserved it for the head of the queue a moment ago: the
-- server's clock (ms) at that release. A lock held by another until past
-- it is taken for held without reading TIME, as rewait.lua does: a lease
-- that ran out since is taken for held, which refuses a free lock, never
-- grants a held one (the contender, told it has that little left, comes
-- back when it would have run out), and the place lapses that much early.
-- Returns {1, token, day, waiting flag} or {0, ms until the holder's lease or the head's
-- window ends (negative when unknown)}.
-- Checks and writes: the state is read first, and a grant written only
-- once the lock is found free (or the contender's), after the queue's
-- writes: a command that fails the script (which is not rolled back), e.g.
-- on a queue or deadlines key that a pruning emptied on the source node of
-- a slot being moved, leaves no grant over a holder.
local old = redis.call('get', KEYS[1])
local d, token, old_day, waiting, owner = parse(old)
local us, now
if ARGV[8] and d and d > tonumber(ARGV[8]) and owner ~= ARGV[1] then
  -- Held by another: no grant below, which alone needs us.
  now = tonumber(ARGV[8])
else
  us, now = clock()
end
local deadline = now + tonumber(ARGV[2])
-- A lock reserved for the contender, the head of the queue, by the release
-- that woke it (see release.lua), or taken by an attempt of its own whose
-- answer never came: it is the contender's, with the token drawn for it,
-- which nobody can have moved since, and this attempt extends it. (An
-- owner id is drawn anew for each acquisition.)
if d and d > now and owner == ARGV[1] then
  local day = day_of(deadline)
  put_day(KEYS[1], state(deadline, token, day, waiting, owner), old_day, day)
  redis.call('lrem', KEYS[2], 0, ARGV[7])
  redis.call('zrem', KEYS[3], ARGV[7])
  return {1, tonumber(token), tonumber(day), tonumber(waiting)}
end
local timeout, window, me = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[7]
local pttl = -2
if d and d > now then
  pttl = d - now
elseif old and not d then
  -- Another format: an earlier warden's lock, with its own expiry.
  pttl = redis.call('pttl', KEYS[1])
end
-- grant takes the free lock for the contender: the head of the queue, with
-- others behind it or not, or nobody's queued.
local function grant(head, behind)
  local t = next_grant(us, token)
  -- Only a grant needs the day: formatted on every attempt, it cost a
  -- refused one 4k more server instructions (callgrind).
  local day = day_of(deadline)
  local flag = waiting or '0'
  if head then
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], me)
    -- Those behind it are woken by its release.
    if behind then
      flag = '2'
    end
  end
  put_day(KEYS[1], state(deadline, fmt(t), day, flag, ARGV[1]), old_day, day)
  return {1, t, tonumber(day), tonumber(flag)}
end
local head
if pttl == -2 then
  -- The head of a free lock's queue, woken by the release, claims at once,
  -- whether its place lapsed meanwhile or not: it is the oldest live
  -- waiter. Places that lapsed behind it are dropped by the next waiter
  -- that does not get the lock, or by a release that finds them first.
  local first = redis.call('lrange', KEYS[2], 0, 1)
  head = first[1]
  if (not head) or head == me then
    return grant(head, first[2] ~= nil)
  end
end
local gone = redis.call('zrangebyscore', KEYS[3], '-inf', now)
for _, id in ipairs(gone) do
  redis.call('lrem', KEYS[2], 0, id)
end
if #gone > 0 then
  redis.call('zremrangebyscore', KEYS[3], '-inf', now)
end
local due
local shaken = #gone > 0
if pttl == -2 then
  if shaken then
    head = redis.call('lindex', KEYS[2], 0)
  end
  while head and head ~= me do
    due = tonumber(redis.call('zscore', KEYS[3], head))
    -- A place without a deadline is nobody's: it would block the queue for
    -- as long as live waiters keep the list from expiring. A deadline within
    -- the window is a head told to confirm, or one about to lapse anyway.
    local period, reserve = handoff_of(head)
    local late = period and due and due > now + window and due - period < now - math.floor(period / 3) - window
    -- The lapsed state in the head's owner's name (d, from parse) is a
    -- reservation it did not claim: a head that renewed its place since,
    -- or within the millisecond it was made (an earlier version's, which
    -- does not claim one), is kept.
    local unclaimed = period and due and d and d > 0 and string.sub(head, -#owner - 1) == '\n' .. owner and due - period < d - reserve
    if due and not late and not unclaimed then
      break
    end
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], head)
    shaken = true
    head = redis.call('lindex', KEYS[2], 0)
  end
  if (not head) or head == me then
    return grant(head, head and redis.call('llen', KEYS[2]) > 1)
  end
end
if ARGV[3] ~= '0' then
  local made = false
  if redis.call('zadd', KEYS[3], now + timeout, me) == 1 then
    made = redis.call('rpush', KEYS[2], me) == 1
    shaken = shaken or ARGV[3] == '2'
  end
  -- The queue disappears with its last waiter, within twice its timeout:
  -- a waiter that queues or renews within a timeout of the last extension
  -- costs none (each place's deadline, not the keys' expiry, says whether
  -- its waiter lives). Only the deadlines' expiry is read: the list's is
  -- set with it, and a list made here gets it, so the list expires no
  -- sooner than the deadlines, which outlast every live place, whatever
  -- timeouts the waiters of the key use. (Only this script extends the
  -- queue's keys, and only here; a PEXPIRE of a missing key makes none.)
  local left = redis.call('pttl', KEYS[3])
  if left < timeout then
    redis.call('pexpire', KEYS[3], 2 * timeout)
    redis.call('pexpire', KEYS[2], 2 * timeout)
  elseif made then
    redis.call('pexpire', KEYS[2], left)
  end
  -- The lock's state says someone waits, so that its release, by whoever
  -- holds it then, fair or not, wakes the queue.
  if d and waiting ~= '2' then
    put(KEYS[1], state(d, token, old_day, '2', owner))
  elseif not old then
    local free_day = day_of(now)
    put_day(KEYS[1], state(0, '0', free_day, '2', ''), nil, free_day)
  end
end
if not due then
  return {0, pttl}
end
local short = now + window
if shaken then
  local stale = redis.call('zrangebyscore', KEYS[3], '(' .. short, now + timeout - 2 * window)
  for _, id in ipairs(stale) do
    if id ~= head then
      redis.call('zadd', KEYS[3], short, id)
      wake(ARGV[6], id)
    end
  end
  -- No release will come to wake the new head.
  wake(ARGV[6], head)
end
if due > short then
  due = short
  redis.call('zadd', KEYS[3], due, head)
end
return {0, due - now}

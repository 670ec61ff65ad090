-- A node's vote for a lock is one string key, {<key>}:lock, that outlives
-- the vote as the node's fence:
--   '<deadline>:<fence>:<day>:<owner>'
-- deadline: when the vote lapses, in ms on the node's clock (0 once
-- withdrawn); fence: the node's fence counter; day: the day (since the
-- epoch) at whose end the key expires, at least a day after the deadline;
-- owner: the voter's owner id ('' once withdrawn). A vote whose deadline
-- passed is free: its key stays, with its fence.
--
-- A vote, a refresh and a withdrawal each write the key's new state and read
-- its old one in a single SET ... KEEPTTL GET (XX for a refresh and a
-- withdrawal, which must not create the key), and write the old one back
-- (or correct the fence) in the rare case it was not theirs to change.
-- KEEPTTL keeps the key's expiry, which moves only when a vote or a refresh
-- needs a later day: once a day for a key in constant use. The
-- helpers (clock, put...) are backends/internal/redisstate's; the
-- vote, withdrawal and refresh scripts (and the waiter's probe, a GET read
-- by the client), on every acquisition's path,
-- read and write the format themselves, with none of them (see
-- acquire.lua).

-- parse reads a state: its deadline (a number), then its fence, day and
-- owner (strings); nothing for a missing key or a value of another format.
local function parse(v)
  if not v then
    return nil
  end
  local d, fence, day, owner = string.match(v, '^(%d+):(%d+):(%d+):(.*)$')
  if not d then
    return nil
  end
  return tonumber(d), fence, day, owner
end

local function state(deadline, fence, day, owner)
  return fmt(deadline) .. ':' .. fence .. ':' .. day .. ':' .. owner
end


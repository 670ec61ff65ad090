-- The prologue of every fenced write. KEYS[1] is the resource's fence, a
-- hash of its highest accepted token (t) and the ids of its latest writes
-- (ops, " id id ... "); ARGV[1] is the writer's token and ARGV[2] the
-- write's id. They are taken off KEYS and ARGV, so the write that follows
-- sees only its own.
local warden_fence = table.remove(KEYS, 1)
local warden_token = table.remove(ARGV, 1)
local warden_id = table.remove(ARGV, 1)
local warden_f = redis.call('HMGET', warden_fence, 't', 'ops')
local warden_high = warden_f[1] or '0'
local warden_ops = warden_f[2] or ' '
-- A client that lost the reply resends the same call (go-redis retries on
-- a broken connection): it was applied, and must not be applied again.
if string.find(warden_ops, ' ' .. warden_id .. ' ', 1, true) then
  return redis.error_reply('WARDEN_APPLIED already')
end
-- Tokens are compared as decimal strings: Lua's numbers are doubles.
if #warden_token < #warden_high or (#warden_token == #warden_high and warden_token < warden_high) then
  return redis.error_reply('WARDEN_STALE ' .. warden_high)
end
-- The claim is accepted. warden_advance records its token and id: the
-- fence's own writes call it after theirs, each one command that either
-- applies or fails having changed nothing, so that a write Redis refuses
-- leaves the fence as it was; a caller's script, which can fail after some
-- of its writes applied, runs after it.
local function warden_advance()
  warden_ops = warden_ops .. warden_id .. ' '
  if #warden_ops > 1 + 17 * 32 then
    warden_ops = string.sub(warden_ops, 18)
  end
  redis.call('HSET', warden_fence, 't', warden_token, 'ops', warden_ops)
end

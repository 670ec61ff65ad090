-- The prologue of every fenced write. KEYS[1] is the resource's fence, a
-- hash of its highest accepted token (t); ARGV[1] is the writer's token.
-- They are taken off KEYS and ARGV, so the write that follows sees only its
-- own.
local warden_fence = table.remove(KEYS, 1)
local warden_token = table.remove(ARGV, 1)
local warden_high = redis.call('HGET', warden_fence, 't') or '0'
-- Tokens are compared as decimal strings: Lua's numbers are doubles.
if #warden_token < #warden_high or (#warden_token == #warden_high and warden_token < warden_high) then
  return redis.error_reply('WARDEN_STALE ' .. warden_high)
end
-- The claim is accepted. warden_advance records its token: the fence's own
-- writes call it after theirs, each one command that either applies or
-- fails having changed nothing, so that a write Redis refuses leaves the
-- fence as it was; a caller's script, which can fail after some of its
-- writes applied, runs after it.
local function warden_advance()
  redis.call('HSET', warden_fence, 't', warden_token)
end

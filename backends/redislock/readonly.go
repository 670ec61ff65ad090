package redislock

import (
	"context"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/redisrefusal"
)

// runReadOnly runs script, which writes nothing, as a read-only one
// (EVALSHA_RO), which a user allowed only to read its keys (%R~) may run:
// Redis 7 takes a script run by EVALSHA for a write to every key it names.
// A server older than 7 knows no EVALSHA_RO, and a user may have EVALSHA
// without it: the script is then run by EVALSHA, as before Redis 7. A
// refusal of a key is the key's, and EVALSHA would be refused it too.
// The script runs on the master of keys[0] even on a client that reads
// from replicas (see resender.readsReplicas), so that the read-only user
// keeps its read there; EVALSHA alone, which go-redis never sends to a
// replica, would be refused to that user.
//
// The fallback is kept once taken: a server that knows no EVALSHA_RO, or a
// user refused it, would refuse every later read too, and guard.Observe
// inspects every tenth of the TTL, which would pay the refused request on
// each.
func (s *scripter) runReadOnly(ctx context.Context, script *goredis.Script, keys []string, args ...any) *goredis.Cmd {
	run := func(c goredis.Scripter) *goredis.Cmd {
		if s.readWrite.Load() {
			return script.Run(ctx, c, keys, args...)
		}
		cmd := script.RunRO(ctx, c, keys, args...)
		if refusesReadOnlyScripts(cmd.Err()) {
			s.readWrite.Store(true)
			cmd = script.Run(ctx, c, keys, args...)
		}
		return cmd
	}
	if s.readsReplicas() {
		return s.onMaster(ctx, keys[0], func(m masterConn) *goredis.Cmd { return run(m) })
	}
	return s.retry(ctx, func() *goredis.Cmd { return run(s.Scripter) })
}

// refusesReadOnlyScripts reports whether err is the server's refusal of
// EVALSHA_RO or EVAL_RO themselves, which it names: unknown to it, or not
// granted to the user. Another refusal a read carries, of a key or of the
// READWRITE before it (see masterConn), would come for EVALSHA too, and
// switching to it for good would outlast the mending of the ACL.
func refusesReadOnlyScripts(err error) bool {
	if err == nil || redisrefusal.KeyDenied(err) ||
		!goredis.HasErrorPrefix(err, "NOPERM") && !goredis.HasErrorPrefix(err, "unknown command") {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "evalsha_ro") || strings.Contains(msg, "eval_ro")
}

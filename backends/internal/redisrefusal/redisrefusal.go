// Package redisrefusal tells, for the Redis and RedLock backends, a
// server's refusal that only an operator mends from a failure that may
// pass.
package redisrefusal

import (
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Permanent reports whether err is a server's refusal of a request that it
// would refuse again however long the caller waited: its ACL denies the
// user a command, a key or a channel (NOPERM), or a command one of
// warden's scripts calls (a script's own calls are checked against the
// user's rights too: Redis 7.0 words that "The user executing the script
// can't ...", 7.2 and Valkey "ACL failure in script: ..."), or the server
// does not know a command warden sends, or one its scripts call (EVALSHA
// or TIME renamed away with rename-command), or the server is older than
// the commands warden's scripts need (their own "warden needs Redis 6.2"
// refusal). A waiting acquisition returns
// such an error at once, where it tries again after a failure that may
// pass (a server out of reach, out of memory, loading, a failover):
// waiting would turn an operator's setting into a wait until the caller's
// context ends, forever for a context with no end, with no word of the
// cause. Authentication errors (NOAUTH, WRONGPASS) are not among them: a
// client whose credentials provider hands out short-lived tokens (IAM
// authentication) may be refused an expired one on a connection, and get a
// fresh one on the next.
func Permanent(err error) bool {
	return goredis.HasErrorPrefix(err, "NOPERM") || goredis.HasErrorPrefix(err, "unknown command") ||
		goredis.HasErrorPrefix(err, "Unknown Redis command called from script") ||
		goredis.HasErrorPrefix(err, "The user executing the script can't") ||
		goredis.HasErrorPrefix(err, "ACL failure in script") ||
		goredis.HasErrorPrefix(err, "warden needs Redis")
}

// KeyDenied reports whether err is a server's refusal of a request for one
// of its keys alone: the user's ACL key patterns leave the key out, where
// the same command on another key would be allowed (Redis 7.0 words it
// "NOPERM this user has no permissions to access one of the keys used as
// arguments", 7.2 and Valkey "NOPERM No permissions to access a key", and
// in a script "The user executing the script can't access at least one of
// the keys ..." and "ACL failure in script: No permissions to access a
// key"). A command or a channel refused is not: it is refused whatever the
// key.
func KeyDenied(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	switch {
	case goredis.HasErrorPrefix(err, "NOPERM"):
		return strings.Contains(msg, "permissions to access one of the keys") || strings.Contains(msg, "No permissions to access a key")
	case goredis.HasErrorPrefix(err, "The user executing the script can't access at least one of the keys"):
		return true
	case goredis.HasErrorPrefix(err, "ACL failure in script"):
		return strings.Contains(msg, "No permissions to access a key")
	}
	return false
}

package redisrefusal

import (
	"errors"
	"fmt"
	"testing"
)

// reply is an error reply as go-redis gives it: an error with the
// RedisError method that goredis.HasErrorPrefix looks for.
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

// TestPermanent: the refusals only an operator mends, in the words the
// servers give them, are told from failures that may pass.
func TestPermanent(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{reply("NOPERM User alice has no permissions to run the 'evalsha' command"), true},
		{reply("ERR unknown command 'EVALSHA', with args beginning with: "), true},
		{reply("Unknown Redis command called from script script: ..."), true},
		{reply("The user executing the script can't run this command or subcommand script: ..."), true},
		{reply("ACL failure in script: this user has no permissions to run the 'get' command"), true},
		// A waiting acquisition on a server older than 6.2 would otherwise
		// try until its context ended, and say only that.
		{reply("warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ERR syntax error"), true},
		{fmt.Errorf("warden: backend unavailable: %w", reply("ERR warden needs Redis 6.2 or newer (SET with KEEPTTL and GET): ERR syntax error")), true},
		{reply("OOM command not allowed when used memory > 'maxmemory'."), false},
		{reply("LOADING Redis is loading the dataset in memory"), false},
		{reply("READONLY You can't write against a read only replica."), false},
		{reply("WRONGPASS invalid username-password pair or user is disabled."), false},
		{errors.New("NOPERM in a message that is not a server's reply"), false},
	} {
		if got := Permanent(c.err); got != c.want {
			t.Errorf("Permanent(%q) = %t, want %t", c.err, got, c.want)
		}
	}
}

// TestKeyDenied: a refusal of one key, in the words the servers give it,
// is told from a refusal of a command or a channel, which is the same
// whatever the key.
func TestKeyDenied(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{reply("NOPERM this user has no permissions to access one of the keys used as arguments"), true},
		{reply("NOPERM No permissions to access a key"), true},
		{reply("ERR The user executing the script can't access at least one of the keys mentioned in the command arguments script: ..."), true},
		{reply("ERR ACL failure in script: No permissions to access a key script: ..."), true},
		{fmt.Errorf("warden: backend unavailable: %w", reply("NOPERM No permissions to access a key")), true},
		{reply("NOPERM this user has no permissions to run the 'get' command"), false},
		{reply("NOPERM User ops has no permissions to run the 'evalsha' command"), false},
		{reply("NOPERM No permissions to access a channel"), false},
		{reply("ERR The user executing the script can't run this command or subcommand script: ..."), false},
		{reply("ERR ACL failure in script: No permissions to run the 'get' command script: ..."), false},
		{errors.New("NOPERM No permissions to access a key, in a message that is not a server's reply"), false},
		{nil, false},
	} {
		if got := KeyDenied(c.err); got != c.want {
			t.Errorf("KeyDenied(%v) = %t, want %t", c.err, got, c.want)
		}
	}
}

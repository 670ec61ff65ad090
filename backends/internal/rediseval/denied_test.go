package rediseval_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/warden-go/warden/backends/internal/rediseval"
)

// reply is an error reply as go-redis gives one (goredis.Error).
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

// TestDenied: the refusal of a script command itself, in the servers'
// words, is told from a refusal of a command the script calls, which may
// come after the script wrote, whatever its code.
func TestDenied(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{reply("NOPERM this user has no permissions to run the 'evalsha' command"), true},
		{reply("NOPERM User ops has no permissions to run the 'evalsha' command"), true},
		{reply("NOPERM this user has no permissions to access one of the keys used as arguments"), true},
		{reply("NOPERM No permissions to access a key"), true},
		{fmt.Errorf("backend unavailable: %w", reply("NOPERM No permissions to access a key")), true},
		{reply("ERR The user executing the script can't run this command or subcommand script: c575, on @user_script:106."), false},
		{reply("ERR ACL failure in script: No permissions to run the 'lindex' command script: c575, on @user_script:106."), false},
		{reply("NOPERM ACL failure in script: No permissions to run the 'lindex' command script: c575, on @user_script:106."), false},
		{reply("NOPERM The user executing the script can't run this command or subcommand"), false},
		{reply("READONLY You can't write against a read only replica."), false},
		{errors.New("NOPERM in a message that is not a server's reply"), false},
		{nil, false},
	} {
		if got := rediseval.Denied(c.err); got != c.want {
			t.Errorf("Denied(%v) = %t, want %t", c.err, got, c.want)
		}
	}
}

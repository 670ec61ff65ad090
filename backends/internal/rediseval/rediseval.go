// Package rediseval sends the scripts of the Redis and RedLock backends as
// commands they build themselves ("evalsha" or "eval", the digest or the
// body, the number of keys, the keys, the arguments), sends once those
// that must not be sent twice, and tells the failures of those that prove
// they ran nothing (Unsent, Denied).
package rediseval

import (
	"context"
	"errors"
	"net"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Client is the part of a go-redis client that sends a command.
type Client interface {
	Process(ctx context.Context, cmd goredis.Cmder) error
}

// Eval sends the script command args on client, which may send it again
// after an error, as its options say, and returns it answered. args is
// the command's, kept until the answer has been read.
func Eval(ctx context.Context, client Client, args ...any) *goredis.Cmd {
	c := newCmd(ctx, args)
	_ = client.Process(ctx, c)
	return c
}

// EvalOnce is Eval for a script that changes what a caller holds (a
// release, a withdrawal of a vote, an idempotency record's completion, a
// fenced write): client sends it at most once. With its default options,
// go-redis sends a command again after an error that leaves its outcome
// unknown (an answer later than the read timeout, a connection broken
// after the write); a release sent again finds the lock released, or
// handed to a waiter, by the first, and answers that it was not held,
// which guard takes for a lock lost during its section. Sent once, it
// fails as unanswered instead, its outcome unknown.
func EvalOnce(ctx context.Context, client Client, args ...any) *goredis.Cmd {
	c := newCmd(ctx, args)
	_ = client.Process(ctx, once{c})
	return c
}

// Unsent reports whether err, the failure of a command sent with EvalOnce,
// proves that the command never left the client: no connection could be
// made or taken from the pool, or the client is closed. A command sent
// with Eval may have gone out on an attempt before the one that failed so.
func Unsent(err error) bool {
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, goredis.ErrPoolTimeout) || errors.Is(err, goredis.ErrClosed)
}

// Denied reports whether err, the failure of a script command, is the
// server's refusal of the command itself for want of rights (NOPERM: the
// user may not run EVALSHA, or touch one of its keys), which the server
// checks before it runs any of the script. A refusal of a command the
// script calls comes after what the script wrote before it: Redis words it
// "ERR The user executing the script can't ..." (7.0) or "ERR ACL failure
// in script: ..." (7.2, Valkey), and ends any error raised inside a script
// with "script: <digest>, on @user_script:<line>.", so that an answer
// naming a script, whatever its code, is not taken for one. (A user whose
// name has the word is named in the refusal too, and is not taken for one
// either: the error then only fails to say that nothing was done.)
func Denied(err error) bool {
	return goredis.HasErrorPrefix(err, "NOPERM") && !strings.Contains(strings.ToLower(err.Error()), "script")
}

// newCmd is args as a command whose first key is args[3], which a Cluster
// client routes by.
func newCmd(ctx context.Context, args []any) *goredis.Cmd {
	c := goredis.NewCmd(ctx, args...)
	c.SetFirstKeyPos(3)
	return c
}

// once is a command go-redis does not send again.
type once struct{ *goredis.Cmd }

func (once) NoRetry() bool { return true }

package redislock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/rediseval"
	"github.com/warden-go/warden/guard/driver"
)

// scripter runs the scripts on a client, adding what a Redis Cluster needs
// and go-redis does not do with its default options:
//
//   - While a lock's slot migrates to another node, a script that names
//     keys of which some exist and some do not is answered TRYAGAIN, and
//     ASK redirections bounce between the nodes. go-redis retries a few
//     times within milliseconds; a release that gives up then leaves the
//     lock taken for its TTL. The script is sent again, with growing
//     pauses, until it is answered otherwise or ctx ends.
//   - After a master dies, go-redis keeps sending its slots' commands to
//     it until a MOVED answer (which a dead node never sends) or its
//     periodic reload, a minute later. A command that fails without an
//     answer from the server makes the client reload the slot map at once
//     (at most every reloadEvery), so locks come back as soon as a replica
//     has been promoted.
//   - After a master is emptied and removed (redis-cli --cluster
//     del-node), a client whose slot map still names it, or was loaded
//     from it, sends it commands it answers "CLUSTERDOWN Hash slot not
//     served", having run nothing: the map is reloaded, and the command
//     sent again, as for a migration.
type scripter struct {
	goredis.Scripter
	client goredis.UniversalClient
	resender
	// readWrite: the scripts that write nothing run by EVALSHA, EVALSHA_RO
	// having been refused (see runReadOnly).
	readWrite atomic.Bool
}

// resender sends a script again, and reloads a Cluster client's slot map,
// as scripter says; the Fence's writes go through one too.
type resender struct {
	cluster  *goredis.ClusterClient    // nil when the client is not a Cluster's
	reloaded atomic.Int64              // unix nanos of the last reload asked for
	asked    atomic.Pointer[askedNode] // the node the last ASK answer named
}

const reloadEvery = 250 * time.Millisecond

func newScripter(c goredis.UniversalClient) *scripter {
	s := &scripter{Scripter: c, client: c}
	s.cluster, _ = c.(*goredis.ClusterClient)
	return s
}

// evalsha runs a script by its digest as go-redis's Script.Run does, but
// on a command the caller built: "evalsha", the digest, the number of keys,
// the keys, the arguments, all of them converted to interface values once
// (by a contender for all its attempts). Script.Run converts them on every
// call, and makes the command's slice, at three allocations or more a
// call on the path of every acquisition and release. On NOSCRIPT (a
// restarted server, SCRIPT FLUSH) it sends the script's body once, in cmd
// for that call only.
func (s *scripter) evalsha(ctx context.Context, src any, cmd []any) *goredis.Cmd {
	return s.run(ctx, src, cmd, rediseval.Eval)
}

// evalshaOnce is evalsha for a release (and the Store's Complete, Abandon
// and Delete, alike), which go-redis must not send again after an error
// that leaves its outcome unknown (see rediseval.EvalOnce): sent once, such
// a release fails as unavailable.
func (s *scripter) evalshaOnce(ctx context.Context, src any, cmd []any) *goredis.Cmd {
	return s.run(ctx, src, cmd, rediseval.EvalOnce)
}

// onceErr is err, the failure of a script sent with evalshaOnce, as
// driver.ErrUnavailable, marked driver.NotSent when it proves that the
// script changed nothing: it never left the client (rediseval.Unsent), a
// slot migration's answers came until ctx ended (each ran nothing), the
// user may not run it or touch its keys (rediseval.Denied: not a refusal
// of a command the script calls, which may come after its writes), or the
// server is a read-only replica, on which no write of the script, the first
// included, can run (READONLY). The mark goes on last: driver.Unavailable
// gives ctx's error alone once ctx is done, as it is whenever a migration's
// answers end the script.
func onceErr(ctx context.Context, err error) error {
	if rediseval.Unsent(err) || migrating(err) || rediseval.Denied(err) || goredis.HasErrorPrefix(err, "READONLY") {
		return driver.NotSent(driver.Unavailable(ctx, err))
	}
	return driver.Unavailable(ctx, err)
}

func (s *scripter) run(ctx context.Context, src any, cmd []any, eval func(context.Context, rediseval.Client, ...any) *goredis.Cmd) *goredis.Cmd {
	send := func() *goredis.Cmd { return eval(ctx, s.client, cmd...) }
	c := s.retry(ctx, send)
	// HasErrorPrefix allocates even for no error.
	if err := c.Err(); err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		name, digest := cmd[0], cmd[1]
		cmd[0], cmd[1] = "eval", src
		c = s.retry(ctx, send)
		cmd[0], cmd[1] = name, digest
	}
	return c
}

func (s *scripter) Eval(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return s.retry(ctx, func() *goredis.Cmd { return s.Scripter.Eval(ctx, script, keys, args...) })
}

func (s *scripter) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return s.retry(ctx, func() *goredis.Cmd { return s.Scripter.EvalSha(ctx, sha1, keys, args...) })
}

func (s *resender) retry(ctx context.Context, send func() *goredis.Cmd) *goredis.Cmd {
	if s.cluster == nil {
		return send()
	}
	pause := driver.Backoff{Min: 2 * time.Millisecond, Max: 100 * time.Millisecond}
	for {
		cmd := send()
		err := cmd.Err()
		if err != nil && (!isReply(err) || unserved(err)) {
			s.reload()
		}
		if err == nil || !migrating(err) {
			return cmd
		}
		// Once ctx is done, the migration's answer is the last: a send
		// then would fail with ctx's error alone, which does not say
		// that nothing was sent.
		if driver.Sleep(ctx, pause.Next(), nil) != nil || ctx.Err() != nil {
			return cmd
		}
	}
}

// migrating reports an answer that a slot migration gives and that comes
// right once it is over: TRYAGAIN for a script whose keys are split between
// the two nodes, and the ASK or MOVED redirection go-redis gives up following
// after its few redirects; or that a node out of the cluster gives (see
// unserved), which comes right once the client's slot map is reloaded. The
// node that answers runs nothing.
func migrating(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "TRYAGAIN") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "MOVED ") || unserved(err)
}

// unserved reports the answer of a node that knows no master for the
// command's slot: a master emptied and removed from the cluster, which the
// client's slot map still names.
func unserved(err error) bool {
	return strings.HasPrefix(err.Error(), "CLUSTERDOWN Hash slot not served")
}

// reload asks the Cluster client to load the slot map again; without one it
// does nothing.
func (s *resender) reload() {
	if s.cluster == nil {
		return
	}
	now := time.Now().UnixNano()
	last := s.reloaded.Load()
	if now-last < int64(reloadEvery) || !s.reloaded.CompareAndSwap(last, now) {
		return
	}
	s.cluster.ReloadState(context.Background())
}

// readsReplicas reports a Cluster client with ReadOnly set, as
// RouteByLatency and RouteRandomly set it, and a FailoverClusterClient's
// routing options: go-redis sends it the commands Redis flags read-only
// (GET, HGET, EVALSHA_RO) to a replica, which lags its master. There a
// held lock may read as free or released, and a fence's token as lower.
func (s *resender) readsReplicas() bool {
	return s.cluster != nil && s.cluster.Options().ReadOnly
}

// isReply tells an answer of the server (a Lua error, NOSCRIPT, MOVED) from
// a failure to get one (a refused or timed-out connection).
func isReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}

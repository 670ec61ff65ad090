package redislock

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/rediseval"
)

// onMaster sends a read by send to the master of key's slot, whatever the
// Cluster client's routing: a read that judges a lock or a token is the
// master's (see readsReplicas). It goes on go-redis's client of the node
// the slot map names the master, which follows no redirection, and the map
// may be out of date. A node that a failover has made a replica answers
// MOVED (see masterConn): the map is reloaded, and the read sent again
// as for a migration (see retry). A master whose slot is moving, and that
// no longer holds the key, answers ASK: the read is sent at once to the
// node named, asking, as go-redis does for a command it routes itself,
// rather than wait the migration out.
func (s *resender) onMaster(ctx context.Context, key string, send func(masterConn) *goredis.Cmd) *goredis.Cmd {
	// The node an ASK answer named, looked up once for all the sends (the
	// node may answer TRYAGAIN until the migration ends; see retry).
	var askedAddr string
	var askedNode *goredis.Client
	return s.retry(ctx, func() *goredis.Cmd {
		m, err := s.cluster.MasterForKey(ctx, key)
		if err != nil {
			c := goredis.NewCmd(ctx)
			c.SetErr(err)
			return c
		}
		c := send(s.masterConn(m))
		if addr, ok := asked(c.Err()); ok {
			if addr != askedAddr {
				askedAddr, askedNode = addr, s.masterAt(ctx, addr)
			}
			if askedNode != nil {
				at := s.masterConn(askedNode)
				at.asking = true
				c = send(at)
			}
		}
		if err := c.Err(); err != nil && goredis.HasErrorPrefix(err, "MOVED") {
			s.reload()
		}
		return c
	})
}

// asked returns the node an ASK answer names.
func asked(err error) (addr string, ok bool) {
	if err == nil || !isReply(err) {
		return "", false
	}
	f := strings.Fields(err.Error())
	if len(f) != 3 || f[0] != "ASK" {
		return "", false
	}
	return f[2], true
}

// masterAt returns go-redis's client of the master at addr, found among the
// masters of a slot map it has loaded anew, or nil. A master that serves no
// slot yet, being given its first, is not among them: a read it is asked
// to send there waits the migration out (see retry). ASK answers come only
// for the keys of a slot being moved, while it moves, so other reads pay
// no load of the map.
func (s *resender) masterAt(ctx context.Context, addr string) *goredis.Client {
	var found atomic.Pointer[goredis.Client]
	_ = s.cluster.ForEachMaster(ctx, func(_ context.Context, m *goredis.Client) error {
		if m.Options().Addr == addr {
			found.Store(m)
		}
		return nil
	})
	return found.Load()
}

// masterConn sends commands on go-redis's client of one node of a Cluster
// so that the node answers them only as the master of their slot, or, when
// asking, as the node the slot is moving to.
//
// go-redis sends READONLY on every connection of a Cluster client with
// ReadOnly set, its nodes' clients' included, and on such a connection a
// replica answers a read of its master's slots from its own data, which
// lags. A node that a failover has made a replica, which the slot map
// still names the master until it is reloaded (a minute later at worst, or
// once a write draws a MOVED), would so answer a held lock as free, a
// fence's token as lower. So, when readOnly, the commands go between
// READWRITE and READONLY, in one pipeline on one connection: a replica
// answers MOVED, a master as it would anyway, for two commands more and no
// round trip more. The node runs a connection's commands in order whatever
// their answers, so the connection goes back to the pool READONLY, as
// go-redis keeps it; go-redis closes one that failed on the way (broken,
// timed out, ctx ended) rather than keep it. Were READONLY refused (the
// user's rights changed since the connection was made), it would stay
// READWRITE: a replica would answer go-redis's own reads on it MOVED, which
// go-redis follows to the master, a cost and no error.
//
// A Cluster client whose slot map comes from ClusterOptions.ClusterSlots
// (a FailoverClusterClient's) sends no READONLY, its nodes being perhaps
// no Cluster's, which know neither command: its commands go as they are.
type masterConn struct {
	node     *goredis.Client
	readOnly bool // the node's connections are READONLY ones
	asking   bool // the node is the one an ASK answer named
}

// masterConn returns node's masterConn. go-redis sends READONLY on its
// nodes' connections unless ClusterSlots gives the slot map.
func (s *resender) masterConn(node *goredis.Client) masterConn {
	return masterConn{node: node, readOnly: s.cluster.Options().ClusterSlots == nil}
}

// Process sends cmd (rediseval.Client).
func (m masterConn) Process(ctx context.Context, cmd goredis.Cmder) error {
	m.exec(ctx, cmd)
	return cmd.Err()
}

// exec sends cmds in one pipeline, as masterConn says. Each has its own
// answer, or failure: Exec's error is only the first's. A READWRITE refused,
// or not answered (go-redis leaves the commands without an error when a
// connection's setup is refused), fails each command: the node may have
// answered them as a replica, or not at all.
func (m masterConn) exec(ctx context.Context, cmds ...goredis.Cmder) {
	p := m.node.Pipeline()
	var rw *goredis.StatusCmd
	if m.readOnly {
		rw = p.ReadWrite(ctx)
	}
	if m.asking {
		_ = p.Process(ctx, goredis.NewStatusCmd(ctx, "asking"))
	}
	for _, c := range cmds {
		_ = p.Process(ctx, c)
	}
	if m.readOnly {
		p.ReadOnly(ctx)
	}
	_, err := p.Exec(ctx)
	if rw == nil || rw.Val() == "OK" {
		return
	}
	err = cmp.Or(rw.Err(), err, fmt.Errorf("READWRITE answered %q", rw.Val()))
	for _, c := range cmds {
		c.SetErr(err)
	}
}

// The script commands, which goredis.Script's Run and RunRO send.

func (m masterConn) Eval(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return rediseval.Eval(ctx, m, scriptArgs("eval", script, keys, args)...)
}

func (m masterConn) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return rediseval.Eval(ctx, m, scriptArgs("evalsha", sha1, keys, args)...)
}

func (m masterConn) EvalRO(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return rediseval.Eval(ctx, m, scriptArgs("eval_ro", script, keys, args)...)
}

func (m masterConn) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return rediseval.Eval(ctx, m, scriptArgs("evalsha_ro", sha1, keys, args)...)
}

// ScriptExists and ScriptLoad judge nothing: they go as they are.

func (m masterConn) ScriptExists(ctx context.Context, hashes ...string) *goredis.BoolSliceCmd {
	return m.node.ScriptExists(ctx, hashes...)
}

func (m masterConn) ScriptLoad(ctx context.Context, script string) *goredis.StringCmd {
	return m.node.ScriptLoad(ctx, script)
}

// scriptArgs is a script command: name ("evalsha", "eval", their _ro
// forms), the digest or the body, the number of keys, the keys, the
// arguments.
func scriptArgs(name, script string, keys []string, args []any) []any {
	argv := make([]any, 0, 3+len(keys)+len(args))
	argv = append(argv, name, script, len(keys))
	for _, k := range keys {
		argv = append(argv, k)
	}
	return append(argv, args...)
}

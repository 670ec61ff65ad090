package redislock

import (
	"cmp"
	"context"
	"errors"
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
	// An address an ASK answer named that no master has (see masterAt),
	// looked up once for all the sends (the node may answer TRYAGAIN
	// until the migration ends; see retry).
	var unknown string
	return s.retry(ctx, func() *goredis.Cmd {
		m, err := s.cluster.MasterForKey(ctx, key)
		if err != nil {
			c := goredis.NewCmd(ctx)
			c.SetErr(err)
			return c
		}
		c := send(s.masterConn(m))
		if addr, ok := asked(c.Err()); ok && addr != unknown {
			if at := s.sendAsking(ctx, addr, send); at != nil {
				c = at
			} else {
				unknown = addr
			}
		}
		if err := c.Err(); err != nil && goredis.HasErrorPrefix(err, "MOVED") {
			s.reload()
		}
		return c
	})
}

// askedNode is the master at addr, the last an ASK answer named, kept for
// the reads after: while a slot moves, each read of a key already moved is
// answered ASK, and finding the node anew (see masterAt) would load the
// whole slot map for each. One is kept, as a reshard moves one slot at a
// time to one node.
//
// It is go-redis's client of the node, which the ASK answers' address
// names: what the node answers does not depend on the client. A node that
// left addr, or another node that took it, is no longer named by ASK
// answers, or answers the read itself as the master of the slot it serves
// (MOVED when the slot is not its own or its import's). The client alone
// can go stale: go-redis closes its client of a node a while after
// loading a slot map without it, and makes another should the node come
// back. A send that finds it closed drops it (see sendAsking).
type askedNode struct {
	addr string
	node *goredis.Client
}

// sendAsking sends by send to the master at addr, asking; nil when there
// is no master at addr (see masterAt).
func (s *resender) sendAsking(ctx context.Context, addr string, send func(masterConn) *goredis.Cmd) *goredis.Cmd {
	if a := s.asked.Load(); a != nil && a.addr == addr {
		c := send(s.askingConn(a.node))
		if !errors.Is(c.Err(), goredis.ErrClosed) {
			return c
		}
		s.asked.CompareAndSwap(a, nil)
	}
	node := s.masterAt(ctx, addr)
	if node == nil {
		return nil
	}
	s.asked.Store(&askedNode{addr: addr, node: node})
	return send(s.askingConn(node))
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
// no load of the map, and those of the slot one, the node found being kept
// (see askedNode).
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

// askingConn is node's masterConn, asking.
func (s *resender) askingConn(node *goredis.Client) masterConn {
	at := s.masterConn(node)
	at.asking = true
	return at
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

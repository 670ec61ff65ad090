package redislock

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// reshardCluster is a Redis Cluster of the test's own: masters without
// replicas, each a redis-server on loopback ports of its own, which the
// test reshards, grows and shrinks as an operator does, by the commands
// redis-cli --cluster runs. The shared servers are never touched.
type reshardCluster struct {
	t      *testing.T
	shards []*shard // the members, in the order they joined
}

// shard is one master of a reshardCluster.
type shard struct {
	addr, bus, id string
	admin         *goredis.Client // to this node alone
}

// startReshardCluster starts masters nodes and gives each an equal range of
// the 16384 slots.
func startReshardCluster(t *testing.T, masters int) *reshardCluster {
	t.Helper()
	c := &reshardCluster{t: t}
	for i := range masters {
		s := c.start()
		c.must(s, "CLUSTER", "ADDSLOTSRANGE", i*16384/masters, (i+1)*16384/masters-1)
		c.must(s, "CLUSTER", "SET-CONFIG-EPOCH", i+1)
		c.shards = append(c.shards, s)
	}
	for _, s := range c.shards[1:] {
		c.meet(s)
	}
	c.settle()
	return c
}

// start runs a cluster-enabled redis-server, a member of no cluster yet.
func (c *reshardCluster) start() *shard {
	c.t.Helper()
	// The bus port of its own, not the default port+10000, which may be
	// past 65535 or taken.
	_, bus, _ := net.SplitHostPort(drivertest.ClosedAddr(c.t))
	// A master emptied of its slots stays a master, to be removed: with
	// replica migration, it would turn into a replica of the master that
	// took its last slot, while the move goes on.
	srv := drivertest.StartRedis(c.t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-port", bus, "--cluster-node-timeout", "5000", "--cluster-allow-replica-migration", "no")
	s := &shard{addr: srv.Addr(), bus: bus}
	s.admin = goredis.NewClient(&goredis.Options{Addr: s.addr, MaxRetries: -1, ReadTimeout: 10 * time.Second})
	c.t.Cleanup(func() { s.admin.Close() })
	s.id, _ = c.must(s, "CLUSTER", "MYID").Text()
	return s
}

// add starts a master with no slots and makes it a member, as
// redis-cli --cluster add-node does.
func (c *reshardCluster) add() *shard {
	c.t.Helper()
	s := c.start()
	c.meet(s)
	c.shards = append(c.shards, s)
	c.settle()
	return s
}

// replicate starts a node and makes it a replica of m, as redis-cli
// --cluster add-node --cluster-slave does, once it follows m and m lists
// it in CLUSTER SLOTS. It is none of c's shards, which are masters.
func (c *reshardCluster) replicate(m *shard) *shard {
	c.t.Helper()
	r := c.start()
	host, port, _ := net.SplitHostPort(r.addr)
	c.must(m, "CLUSTER", "MEET", host, port, r.bus)
	eventually(c.t, "the replica knows its master", func() bool {
		return c.do(r, "CLUSTER", "REPLICATE", m.id).Err() == nil
	})
	eventually(c.t, "the replica follows its master", func() bool {
		info, _ := c.do(r, "INFO", "replication").Text()
		return strings.Contains(info, "master_link_status:up")
	})
	eventually(c.t, "the master lists its replica", func() bool {
		return strings.Contains(fmt.Sprint(c.must(m, "CLUSTER", "SLOTS").Val()), port)
	})
	return r
}

// remove takes s, emptied of its slots, out of the cluster as
// redis-cli --cluster del-node does: every other member forgets it, and it
// is reset, alone and still running, as an operator's node is until they
// stop it.
func (c *reshardCluster) remove(s *shard) {
	c.t.Helper()
	c.shards = slices.DeleteFunc(c.shards, func(o *shard) bool { return o == s })
	for _, o := range c.shards {
		c.must(o, "CLUSTER", "FORGET", s.id)
	}
	c.must(s, "CLUSTER", "RESET", "SOFT")
	c.settle()
}

func (c *reshardCluster) meet(s *shard) {
	c.t.Helper()
	host, port, _ := net.SplitHostPort(s.addr)
	c.must(c.shards[0], "CLUSTER", "MEET", host, port, s.bus)
}

func (c *reshardCluster) do(s *shard, args ...any) *goredis.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.admin.Do(ctx, args...)
}

func (c *reshardCluster) must(s *shard, args ...any) *goredis.Cmd {
	c.t.Helper()
	cmd := c.do(s, args...)
	if err := cmd.Err(); err != nil {
		c.t.Fatalf("%s: %v: %v", s.addr, args, err)
	}
	return cmd
}

// settle waits until every member knows every other, has its bus link to
// every other, serves all the slots, and sees each slot on the same master.
func (c *reshardCluster) settle() {
	c.t.Helper()
	var why string
	deadline := time.Now().Add(30 * time.Second)
	for {
		if why = c.unsettled(); why == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the cluster did not settle within 30s: %s", why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unsettled says why the members do not agree yet, or "".
func (c *reshardCluster) unsettled() string {
	var first string
	for _, s := range c.shards {
		info, err := c.do(s, "CLUSTER", "INFO").Text()
		if err != nil {
			return err.Error()
		}
		for _, want := range []string{"cluster_state:ok", fmt.Sprintf("cluster_known_nodes:%d", len(c.shards))} {
			if !strings.Contains(info, want) {
				return fmt.Sprintf("%s: CLUSTER INFO lacks %s", s.addr, want)
			}
		}
		nodes, err := c.do(s, "CLUSTER", "NODES").Text()
		if err != nil {
			return err.Error()
		}
		if id := unlinked(nodes); id != "" {
			return fmt.Sprintf("%s has no bus link to %s", s.addr, id)
		}
		view := slotView(nodes)
		if first == "" {
			first = view
		} else if view != first {
			return fmt.Sprintf("%s sees the slots as %s, %s as %s", s.addr, view, c.shards[0].addr, first)
		}
	}
	return ""
}

// slotView is what CLUSTER NODES says of who serves which slots, in one
// line, with no flags a node gives only itself ("myself"); a node still
// shaking hands makes it differ.
func slotView(nodes string) string {
	var lines []string
	for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		var slots []string
		for _, s := range f[8:] {
			if !strings.HasPrefix(s, "[") { // a slot being migrated or imported
				slots = append(slots, s)
			}
		}
		state := "ok"
		for flag := range strings.SplitSeq(f[2], ",") {
			if flag == "handshake" || flag == "noaddr" || flag == "fail" || flag == "fail?" {
				state = flag
			}
		}
		lines = append(lines, f[0]+" "+state+" "+strings.Join(slots, ","))
	}
	slices.Sort(lines)
	return strings.Join(lines, "; ")
}

// unlinked is the first member CLUSTER NODES says the node has no bus link
// to (link-state disconnected), or "". A member sends its messages to
// another, the PUBLISHes it relays too, on the link it made to that one
// alone, and drops them while there is none: a member that learned of a
// node that joined from another's gossip makes its link at its next cron,
// up to 100 ms later, so a node that every member already knows may still
// miss one member's PUBLISHes.
func unlinked(nodes string) string {
	for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
		if f := strings.Fields(line); len(f) >= 8 && f[7] != "connected" {
			return f[0]
		}
	}
	return ""
}

// client is a Cluster client of the members at its making, with go-redis's
// default options but for those given, closed when the test ends.
func (c *reshardCluster) client(opts ...func(*goredis.ClusterOptions)) *goredis.ClusterClient {
	o := &goredis.ClusterOptions{}
	for _, s := range c.shards {
		o.Addrs = append(o.Addrs, s.addr)
	}
	for _, f := range opts {
		f(o)
	}
	cc := goredis.NewClusterClient(o)
	c.t.Cleanup(func() { cc.Close() })
	return cc
}

// slot is the hash slot of key.
func (c *reshardCluster) slot(key string) int {
	c.t.Helper()
	n, err := c.must(c.shards[0], "CLUSTER", "KEYSLOT", key).Int()
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// owner is the member that serves slot, as the first member sees it.
func (c *reshardCluster) owner(slot int) *shard {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shards, err := c.shards[0].admin.ClusterShards(ctx).Result()
	if err != nil {
		c.t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if slot < int(r.Start) || slot > int(r.End) {
				continue
			}
			for _, n := range sh.Nodes {
				for _, s := range c.shards {
					if n.Role == "master" && s.id == n.ID {
						return s
					}
				}
			}
		}
	}
	c.t.Fatalf("no member serves slot %d", slot)
	return nil
}

// other is a member other than s.
func (c *reshardCluster) other(s *shard) *shard {
	i := slices.Index(c.shards, s)
	return c.shards[(i+1)%len(c.shards)]
}

// moveSlot moves slot from src to dst as redis-cli --cluster reshard does:
// IMPORTING on dst, MIGRATING on src, the slot's keys batch at a time
// (MIGRATE ... KEYS), then the slot given to dst on dst, on src and on every
// other member. between, when not nil, runs while the slot is open: before
// the first batch and after each, so that a test acts on a slot half moved.
func (c *reshardCluster) moveSlot(slot int, src, dst *shard, batch int, between func()) {
	c.t.Helper()
	c.must(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
	c.must(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
	host, port, _ := net.SplitHostPort(dst.addr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if between != nil {
			between()
		}
		keys, err := c.do(src, "CLUSTER", "GETKEYSINSLOT", slot, batch).StringSlice()
		if err != nil {
			c.t.Fatalf("GETKEYSINSLOT %d on %s: %v", slot, src.addr, err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("slot %d still has keys on %s after 30s: %v", slot, src.addr, keys)
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := c.do(src, args...).Err(); err != nil && !strings.Contains(err.Error(), "NOKEY") {
			c.t.Fatalf("MIGRATE %v from %s to %s: %v", keys, src.addr, dst.addr, err)
		}
	}
	c.must(dst, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
	c.must(src, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
	for _, s := range c.shards {
		if s != src && s != dst {
			c.must(s, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
		}
	}
	c.settle()
}
